//! `CUDA_VISIBLE_DEVICES` in all its forms, through the NVML backend on
//! eight fake GPUs and two MIG instances.

mod common;

use common::{assert_child_ok, is_child, run_child, Fake, GIB};
use memprobe_core::ErrorKind;
use memprobe_gpu::{GpuConfig, Gpus};

const UUIDS: [&str; 8] = [
    "GPU-00aa0000-0000-4000-8000-000000000000",
    "GPU-11bb0000-0000-4000-8000-000000000001",
    "GPU-22cc0000-0000-4000-8000-000000000002",
    "GPU-33dd0000-0000-4000-8000-000000000003",
    "GPU-44ee0000-0000-4000-8000-000000000004",
    "GPU-45ff0000-0000-4000-8000-000000000005",
    "GPU-66000000-0000-4000-8000-000000000006",
    "GPU-77110000-0000-4000-8000-000000000007",
];
const MIG_A: &str = "MIG-aaaaaaaa-0000-4000-8000-000000000000";
const MIG_B: &str = "MIG-bbbbbbbb-0000-4000-8000-000000000000";

/// Eight GPUs (total = index+1 GiB) and two MIG instances (20 and 30 GiB).
fn fake() -> Fake {
    let mut s = String::new();
    for (i, u) in UUIDS.iter().enumerate() {
        s += &format!(
            "device {i} uuid {u}\ndevice {i} total {}\n",
            (i as u64 + 1) * GIB
        );
    }
    s += &format!(
        "device 8 mig\ndevice 8 uuid {MIG_A}\ndevice 8 total {}\ndevice 8 name MIG 1g.10gb\n",
        20 * GIB
    );
    s += &format!(
        "device 9 mig\ndevice 9 uuid {MIG_B}\ndevice 9 total {}\n",
        30 * GIB
    );
    Fake::nvml(&s)
}

/// The NVML index (physical) or `100 + total GiB` (MIG) of each visible device.
fn visible(fake: &Fake, spec: Option<&str>) -> Vec<u64> {
    let gpus = Gpus::open(GpuConfig {
        visible_devices: spec.map(str::to_string),
        ..fake.nvml_config()
    })
    .unwrap();
    (0..gpus.device_count().unwrap())
        .map(|id| {
            let h = gpus.device(id).unwrap();
            assert_eq!(h.id(), id);
            match h.info().nvml_index {
                Some(i) => {
                    assert_eq!(h.memory().unwrap().total, (i as u64 + 1) * GIB);
                    i as u64
                }
                None => 100 + h.memory().unwrap().total / GIB,
            }
        })
        .collect()
}

#[test]
fn unset_shows_all_physical_devices() {
    let f = fake();
    assert_eq!(visible(&f, None), [0, 1, 2, 3, 4, 5, 6, 7]);
}

#[test]
fn empty_hides_all() {
    let f = fake();
    assert_eq!(visible(&f, Some("")), Vec::<u64>::new());
    let gpus = Gpus::open(GpuConfig {
        visible_devices: Some(String::new()),
        ..f.nvml_config()
    })
    .unwrap();
    let e = gpus.device(0).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable);
    assert!(e.message().contains("hides every GPU"), "{e}");
}

#[test]
fn indices_and_reordering() {
    let f = fake();
    assert_eq!(visible(&f, Some("3")), [3]);
    assert_eq!(visible(&f, Some("7,0,5")), [7, 0, 5]);
    assert_eq!(visible(&f, Some("2, 1")), [2, 1]);
}

#[test]
fn uuids_and_prefixes() {
    let f = fake();
    assert_eq!(visible(&f, Some(UUIDS[6])), [6]);
    assert_eq!(
        visible(&f, Some(&format!("{},{}", UUIDS[4], UUIDS[1]))),
        [4, 1]
    );
    assert_eq!(visible(&f, Some("GPU-33,GPU-00aa")), [3, 0]);
    // "GPU-4" matches two devices: ambiguous, so invalid, hiding the rest.
    assert_eq!(visible(&f, Some("GPU-77,GPU-4,0")), [7]);
    assert_eq!(visible(&f, Some("GPU-45")), [5]);
    let gpus = Gpus::open(GpuConfig {
        visible_devices: Some("GPU-22".into()),
        ..f.nvml_config()
    })
    .unwrap();
    assert_eq!(
        gpus.device(0).unwrap().info().uuid.as_deref(),
        Some(UUIDS[2])
    );
}

#[test]
fn mig_instances() {
    let f = fake();
    assert_eq!(visible(&f, Some(MIG_B)), [130]);
    assert_eq!(visible(&f, Some(&format!("{MIG_A},{MIG_B}"))), [120, 130]);
    assert_eq!(visible(&f, Some(&format!("{MIG_A},2"))), [120, 2]);
    assert_eq!(visible(&f, Some("MIG-cccccccc,1")), Vec::<u64>::new());
    let gpus = Gpus::open(GpuConfig {
        visible_devices: Some(MIG_A.into()),
        ..f.nvml_config()
    })
    .unwrap();
    let info = gpus.device(0).unwrap().info().clone();
    assert_eq!(info.uuid.as_deref(), Some(MIG_A));
    assert_eq!(info.name.as_deref(), Some("MIG 1g.10gb"));
    assert_eq!(info.nvml_index, None);
}

#[test]
fn invalid_entry_hides_it_and_the_rest() {
    let f = fake();
    assert_eq!(visible(&f, Some("1,8,2")), [1]);
    assert_eq!(visible(&f, Some("1,junk,2")), [1]);
    assert_eq!(visible(&f, Some("-1")), Vec::<u64>::new());
    assert_eq!(visible(&f, Some("4,GPU-99,2")), [4]);
}

#[test]
fn duplicates_are_invalid() {
    let f = fake();
    assert_eq!(visible(&f, Some("1,1,2")), [1]);
    assert_eq!(visible(&f, Some(&format!("3,{}", UUIDS[3]))), [3]);
}

#[test]
fn invalid_ids_after_mapping() {
    let f = fake();
    let gpus = Gpus::open(GpuConfig {
        visible_devices: Some("5,6".into()),
        ..f.nvml_config()
    })
    .unwrap();
    assert_eq!(gpus.device_count().unwrap(), 2);
    let e = gpus.device(2).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidId);
    assert!(e.message().contains("sees 2"), "{e}");
    assert_eq!(
        gpus.set_current_device(2).unwrap_err().kind(),
        ErrorKind::InvalidId
    );
    gpus.set_current_device(1).unwrap();
    assert_eq!(gpus.current_device().unwrap(), 1);
    assert_eq!(gpus.gpu_mem_get(None).value.total, 7 * GIB);
}

/// `Gpus::from_env` reads the real variable.
#[test]
fn from_the_environment() {
    let f = fake();
    let out = run_child(
        "from_the_environment_child",
        &[
            ("MEMPROBE_NVML_LIBRARY", f.lib.to_str().unwrap()),
            ("CUDA_VISIBLE_DEVICES", "GPU-66,3"),
        ],
    );
    assert_child_ok(&out, "CHILD-DONE");
}

#[test]
fn from_the_environment_child() {
    if !is_child("from_the_environment_child") {
        return;
    }
    let gpus = Gpus::from_env().unwrap();
    let idx: Vec<_> = gpus
        .device_infos()
        .iter()
        .map(|i| i.nvml_index.unwrap())
        .collect();
    assert_eq!(idx, [6, 3]);
    println!("CHILD-DONE");
}
