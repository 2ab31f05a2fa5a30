// docs-test fixture: a Rust block, run as the body of main, with the
// training step it calls.
// docs-test: includes

fn train_step() {
    let v = vec![1u8; 32 << 20];
    std::hint::black_box(&v);
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // docs-test: block
    Ok(())
}
