//! Trace behaviour (fastai GPUMemTrace) over pushed and process sources.

mod common;
use common::{serial, spike, Buf, MIB};
use memprobe_core::{ErrorKind, SnapshotSink, Source, Trace, TraceOptions};
use std::sync::Arc;

fn traced(ctx: Option<&str>) -> (Source, Trace, Buf) {
    let src = Source::pushed("gpu").unwrap();
    src.push(100 * MIB).unwrap();
    let mut t = Trace::new(
        std::slice::from_ref(&src),
        TraceOptions {
            ctx: ctx.map(Into::into),
            ..Default::default()
        },
    )
    .unwrap();
    let buf = Buf::default();
    t.set_output(Box::new(buf.clone()));
    (src, t, buf)
}

#[test]
fn report_data_reset_and_report_n_reset() {
    let (src, mut t, buf) = traced(Some("foobar"));
    src.push(300 * MIB).unwrap();
    src.push(150 * MIB).unwrap();
    let d = t.data().unwrap();
    assert_eq!(
        (d[0].delta_used, d[0].delta_peaked),
        (50 * MIB as i64, 150 * MIB)
    );
    t.report(Some("1st try")).unwrap();
    t.report_n_reset(Some("2nd try")).unwrap();
    let d = t.data().unwrap();
    assert_eq!((d[0].delta_used, d[0].delta_peaked), (0, 0));
    assert_eq!(
        buf.text(),
        "△Used Peaked MB:     50    150 (foobar: 1st try)\n△Used Peaked MB:     50    150 (foobar: 2nd try)\n"
    );
}

#[test]
fn silent_stop_freezes_and_order_errors() {
    let (src, mut t, buf) = traced(None);
    t.set_silent(true);
    src.push(164 * MIB).unwrap();
    let line = t.report(None).unwrap();
    assert_eq!(line, "△Used Peaked MB:     64      0");
    assert_eq!(buf.text(), "", "silent traces print nothing");
    t.set_silent(false);
    t.stop().unwrap();
    src.push(500 * MIB).unwrap();
    assert_eq!(
        t.data().unwrap()[0].delta_used,
        64 * MIB as i64,
        "stopped trace is frozen"
    );
    assert_eq!(
        t.stop().unwrap_err().kind(),
        ErrorKind::WrongOrder,
        "double stop"
    );
    assert_eq!(t.reset().unwrap_err().kind(), ErrorKind::WrongOrder);
    assert_eq!(
        t.report_n_reset(None).unwrap_err().kind(),
        ErrorKind::WrongOrder
    );
    t.report(Some("frozen")).unwrap();
    assert_eq!(buf.text(), "△Used Peaked MB:     64      0 (frozen)\n");
    t.start().unwrap();
    assert_eq!(t.start().unwrap_err().kind(), ErrorKind::WrongOrder);

    let mut never = Trace::new(
        &[src],
        TraceOptions {
            start: false,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(
        never.stop().unwrap_err().kind(),
        ErrorKind::WrongOrder,
        "stop before start"
    );
    assert_eq!(never.data().unwrap_err().kind(), ErrorKind::WrongOrder);
}

#[test]
fn guard_reports_exit_once_and_sinks_get_records() {
    let (src, t, buf) = traced(Some("some_func"));
    let sink = Arc::new(SnapshotSink::new());
    {
        let mut g = t.guard();
        g.add_sink(sink.clone());
        src.push(101 * MIB).unwrap();
    }
    assert_eq!(
        buf.text(),
        "△Used Peaked MB:      1      0 (some_func: exit)\n"
    );
    let recs = sink.records();
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0].label, "some_func: exit");
    assert_eq!(recs[0].sources[0].delta_used, MIB as i64);

    let (_src, t, buf) = traced(None);
    let t = t.guard().into_inner();
    drop(t);
    assert_eq!(buf.text(), "", "into_inner skips the exit report");
}

#[test]
fn trace_over_process_sees_exact_spike() {
    let _g = serial();
    let rss = Source::process().unwrap();
    let mut t = Trace::new(
        &[rss],
        TraceOptions {
            silent: true,
            ..Default::default()
        },
    )
    .unwrap();
    spike(256 * MIB as usize);
    let d = t.data().unwrap();
    assert!(d[0].delta_peaked >= 250 * MIB, "{d:?}");
    t.report_n_reset(None).unwrap();
    assert!(t.data().unwrap()[0].delta_peaked < 64 * MIB);
}
