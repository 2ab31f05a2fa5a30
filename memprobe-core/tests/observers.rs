//! A tracker tells its observers every phase boundary, in order: a consumer
//! added from outside (as an integration or a profiler would be) sees what
//! the built-in ones (run channel, leak trends, out-of-memory report) see.

use memprobe_core::LeakPolicy;
use memprobe_core::{PhaseBegun, PhaseKind, PhaseObserver, Record, SnapshotSink, Source, Tracker};
use std::sync::{Arc, Mutex};

#[derive(Default)]
struct Log {
    said: Arc<Mutex<Vec<String>>>,
}

impl Log {
    fn say(&self, s: String) {
        self.said.lock().unwrap().push(s);
    }
}

fn what(r: &Record) -> String {
    let p = r.phase.as_ref().unwrap();
    format!("{} {} depth {}", p.name, p.index, p.depth)
}

impl PhaseObserver for Log {
    fn on_phase_begin(&mut self, phase: &PhaseBegun<'_>) {
        self.say(format!(
            "begin {} {} depth {}",
            phase.name,
            phase.index(),
            phase.depth
        ));
    }

    fn on_phase_record(&mut self, record: &mut Record) {
        // Added after the leak trends: their verdict is already there.
        self.say(format!(
            "record {} leaks {}",
            what(record),
            record.leaks.len()
        ));
        record.label.push_str(" (seen)");
    }

    fn on_phase_end(&mut self, record: &Record, next: bool) {
        self.say(format!(
            "end {}{}",
            what(record),
            if next { " next" } else { "" }
        ));
    }

    fn on_tracker_drop(&mut self) {
        self.say("drop".into());
    }
}

/// Only the default methods: nothing to write for what it does not need.
struct Nothing;
impl PhaseObserver for Nothing {}

#[test]
fn an_added_observer_is_told_every_boundary_in_order() {
    let src = Source::pushed("alloc").unwrap();
    src.push(100).unwrap();
    let mut t = Tracker::new(std::slice::from_ref(&src)).unwrap();
    t.set_leak_policy(Some(LeakPolicy {
        threshold: 0,
        epochs: 1,
    }))
    .unwrap();
    let snap = Arc::new(SnapshotSink::new());
    t.add_sink(snap.clone());
    let log = Log::default();
    let said = Arc::clone(&log.said);
    t.add_observer(Box::new(Nothing));
    t.add_observer(Box::new(log));

    t.begin(PhaseKind::Epoch, None).unwrap();
    t.begin(PhaseKind::Step, None).unwrap();
    let step = t.next(PhaseKind::Step, None).unwrap();
    t.end(PhaseKind::Step, None).unwrap();
    let epoch = t.end(PhaseKind::Epoch, None).unwrap();
    // What an observer adds to a record is in what the caller and the
    // sinks get.
    assert_eq!(step.label, "step (seen)");
    assert_eq!(epoch.label, "epoch (seen)");
    let labels: Vec<String> = snap.records().into_iter().map(|r| r.label).collect();
    assert_eq!(labels, ["step (seen)", "step (seen)", "epoch (seen)"]);
    // The leak trends are still the tracker's.
    assert_eq!(epoch.leaks.len(), 1);
    assert!(t.leak_status(0).is_ok());
    drop(t);
    assert_eq!(
        *said.lock().unwrap(),
        [
            "begin epoch 0 depth 0",
            "begin step 0 depth 1",
            "record step 0 depth 1 leaks 0",
            "end step 0 depth 1 next",
            "record step 1 depth 1 leaks 0",
            "end step 1 depth 1",
            "record epoch 0 depth 0 leaks 1",
            "end epoch 0 depth 0",
            "drop",
        ]
    );
}
