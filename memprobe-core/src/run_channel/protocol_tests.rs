//! The protocol's tests: every message round-trips, and anything else is
//! refused, never a crash.

use super::*;
use crate::phase::PhaseInfo;
use crate::sample::{PeakFidelity, SourceKind};

/// A step's record over `sources` process sources named `{name}{i}`
/// (the sender's tests use it too).
pub(crate) fn record(sources: usize, name: &str) -> Record {
    let deltas = (0..sources)
        .map(|i| {
            SourceDelta::new(
                &format!("{name}{i}"),
                SourceKind::Process,
                PeakFidelity::Exact,
                100,
                120,
                300 + i as u64,
            )
        })
        .collect();
    let mut r = Record::new("step", 1_000, 2_000, deltas);
    r.phase = Some(PhaseInfo {
        kind: PhaseKind::Step,
        name: "step".into(),
        index: 17,
        depth: 1,
    });
    r
}

const HEAD: Head = Head {
    pid: 4242,
    tracker: 3,
    seq: 9,
    dropped: 2,
    dropped_steps: 1,
    ranks: None,
};

#[test]
fn begin_and_end_encode_exactly() {
    let mut buf = String::new();
    encode(
        &mut buf,
        &HEAD,
        &Outgoing::Begin {
            kind: PhaseKind::Custom,
            name: "a \"quoted\"\\name\u{1}é",
            index: 4,
            depth: 2,
            t_ns: 123,
        },
    );
    assert_eq!(
        buf,
        r#"{"v":1,"ev":"begin","pid":4242,"tracker":3,"seq":9,"dropped":2,"dropped_steps":1,"kind":"custom","name":"a \"quoted\"\\name\u0001é","index":4,"depth":2,"t_ns":123}"#
    );
    encode(
        &mut buf,
        &HEAD,
        &Outgoing::End {
            record: &record(1, "rss"),
            next: true,
        },
    );
    assert_eq!(
        buf,
        r#"{"v":1,"ev":"end","pid":4242,"tracker":3,"seq":9,"dropped":2,"dropped_steps":1,"kind":"step","name":"step","index":17,"depth":1,"started_ns":1000,"ended_ns":2000,"next":true,"releases":0,"sources":[{"name":"rss0","kind":"process","fidelity":"exact","used_start":100,"used_end":120,"peak":300,"delta_used":20,"delta_peaked":180}],"truncated":false}"#
    );
}

#[test]
fn a_rank_is_in_every_message_and_a_process_without_sends_none() {
    let mut head = HEAD;
    head.ranks = Some(Ranks {
        rank: 1,
        local_rank: Some(0),
        world_size: 2,
    });
    let mut buf = String::new();
    let begin = Outgoing::Begin {
        kind: PhaseKind::Epoch,
        name: "epoch",
        index: 0,
        depth: 0,
        t_ns: 5,
    };
    encode(&mut buf, &head, &begin);
    assert_eq!(
        buf,
        r#"{"v":1,"ev":"begin","pid":4242,"tracker":3,"seq":9,"dropped":2,"dropped_steps":1,"rank":1,"world_size":2,"local_rank":0,"kind":"epoch","name":"epoch","index":0,"depth":0,"t_ns":5}"#
    );
    head.ranks = head.ranks.map(|r| Ranks {
        local_rank: None,
        ..r
    });
    encode(
        &mut buf,
        &head,
        &Outgoing::End {
            record: &record(1, "rss"),
            next: false,
        },
    );
    assert!(
        buf.contains(r#""dropped_steps":1,"rank":1,"world_size":2,"kind":"step","#),
        "{buf}"
    );
    encode(&mut buf, &HEAD, &begin);
    assert!(
        !buf.contains("rank") && !buf.contains("world_size"),
        "{buf}"
    );
}

#[test]
fn ranks_no_process_could_have_are_refused() {
    let good = BEGIN.replace(
        r#""dropped":0,"#,
        r#""dropped":0,"rank":1,"local_rank":1,"world_size":2,"#,
    );
    let m = decode(good.as_bytes()).unwrap();
    assert_eq!(
        m.ranks,
        Some(Ranks {
            rank: 1,
            local_rank: Some(1),
            world_size: 2
        })
    );
    // Without a local rank: still a rank.
    let no_local = good.replace(r#""local_rank":1,"#, "");
    assert_eq!(
        decode(no_local.as_bytes())
            .unwrap()
            .ranks
            .unwrap()
            .local_rank,
        None
    );
    for bad in [
        good.replace(r#""rank":1"#, r#""rank":2"#),
        good.replace(r#""local_rank":1"#, r#""local_rank":5"#),
        good.replace(r#""rank":1"#, r#""rank":-1"#),
        good.replace(r#""rank":1"#, r#""rank":"1""#),
        good.replace(r#""world_size":2"#, r#""world_size":0"#),
        good.replace(r#","world_size":2"#, ""),
        good.replace(r#""rank":1,"#, ""),
        BEGIN.replace(r#""dropped":0,"#, r#""dropped":0,"local_rank":0,"#),
    ] {
        assert_eq!(
            decode(bad.as_bytes()).err(),
            Some(Unreadable::Garbled),
            "{bad}"
        );
    }
}

#[test]
fn a_huge_record_is_cut_under_the_bound_and_says_so() {
    let long = "x".repeat(60);
    let mut buf = String::new();
    encode(
        &mut buf,
        &HEAD,
        &Outgoing::End {
            record: &record(2000, &long),
            next: false,
        },
    );
    assert!(buf.len() <= MAX_DATAGRAM, "{}", buf.len());
    assert!(
        buf.ends_with(r#"],"truncated":true}"#),
        "{}",
        &buf[buf.len() - 40..]
    );
    let kept = buf.matches("\"fidelity\"").count();
    assert!(kept > 100 && kept < 2000, "{kept}");
    // The longest escaped name still fits one entry.
    let worst = "\u{1}".repeat(64);
    let mut one = String::new();
    encode(
        &mut one,
        &HEAD,
        &Outgoing::End {
            record: &record(1, &worst[..63]),
            next: false,
        },
    );
    let entry_len = one.len() - one.find("[{").unwrap();
    assert!(entry_len < MAX_SOURCE_ENTRY, "{entry_len}");
}

fn wire_source(d: &SourceDelta) -> SourceRecord {
    SourceRecord {
        name: d.name.clone(),
        kind: d.kind.as_str().into(),
        fidelity: d.fidelity.as_str().into(),
        used_start: d.used_start,
        used_end: d.used_end,
        peak: d.peak,
        delta_used: d.delta_used,
        delta_peaked: d.delta_peaked,
    }
}

/// What each end makes of the other: every message the sender can
/// encode decodes to what it said, field for field, from a process
/// with ranks (with and without a local rank, at the bounds) and
/// without.
#[test]
fn every_message_round_trips() {
    for ranks in [
        None,
        Some(Ranks {
            rank: 1,
            local_rank: Some(1),
            world_size: 2,
        }),
        Some(Ranks {
            rank: u32::MAX - 1,
            local_rank: None,
            world_size: u32::MAX,
        }),
        Some(Ranks {
            rank: 0,
            local_rank: Some(0),
            world_size: 1,
        }),
    ] {
        round_trip(Head {
            pid: u32::MAX,
            tracker: u64::MAX,
            seq: 1 << 60,
            dropped: 7,
            dropped_steps: 4096,
            ranks,
        });
    }
}

fn round_trip(head: Head) {
    let mut buf = String::new();
    let expect = |kind, name: &str, index, depth, event| Message {
        pid: head.pid,
        tracker: head.tracker,
        seq: head.seq,
        dropped: head.dropped,
        dropped_steps: head.dropped_steps,
        ranks: head.ranks,
        kind,
        name: name.into(),
        index,
        depth,
        event,
    };
    for kind in [
        PhaseKind::Step,
        PhaseKind::Epoch,
        PhaseKind::Experience,
        PhaseKind::Stream,
        PhaseKind::Custom,
    ] {
        let name = if kind == PhaseKind::Custom {
            "a \"quoted\" é/name"
        } else {
            kind.as_str()
        };
        encode(
            &mut buf,
            &head,
            &Outgoing::Begin {
                kind,
                name,
                index: 5,
                depth: 3,
                t_ns: u64::MAX,
            },
        );
        assert_eq!(
            decode(buf.as_bytes()),
            Ok(expect(kind, name, 5, 3, Event::Begin { t_ns: u64::MAX })),
            "{buf}"
        );
    }

    let mut r = record(3, "gpu:0 \"hbm\"");
    r.sources[1].delta_used = -20;
    r.releases.push(crate::release::ReleaseEvent {
        reason: crate::release::ReleaseReason::Periodic,
        phase: None,
        ran: Vec::new(),
        errors: Vec::new(),
        before: Vec::new(),
        after: Vec::new(),
    });
    encode(
        &mut buf,
        &head,
        &Outgoing::End {
            record: &r,
            next: true,
        },
    );
    assert_eq!(
        decode(buf.as_bytes()),
        Ok(expect(
            PhaseKind::Step,
            "step",
            17,
            1,
            Event::End {
                started_ns: 1_000,
                ended_ns: 2_000,
                next: true,
                releases: 1,
                sources: r.sources.iter().map(wire_source).collect(),
                truncated: false,
            }
        ))
    );

    let peaks: Vec<PeakOut> = record(2, "rss")
        .sources
        .into_iter()
        .enumerate()
        .map(|(i, delta)| PeakOut {
            delta,
            index: 40 + i as u64,
            started_ns: 100 + i as u64,
            ended_ns: 200 + i as u64,
        })
        .collect();
    encode(
        &mut buf,
        &head,
        &Outgoing::Steps {
            name: "step",
            depth: 1,
            first: 40,
            last: 45,
            count: 6,
            started_ns: 90,
            ended_ns: 300,
            next: false,
            releases: 2,
            truncated: true,
            peaks: &peaks,
        },
    );
    assert_eq!(
        decode(buf.as_bytes()),
        Ok(expect(
            PhaseKind::Step,
            "step",
            40,
            1,
            Event::Steps {
                last: 45,
                count: 6,
                started_ns: 90,
                ended_ns: 300,
                next: false,
                releases: 2,
                peaks: peaks
                    .iter()
                    .map(|p| BatchPeak {
                        index: p.index,
                        start_ns: p.started_ns,
                        end_ns: p.ended_ns,
                        source: wire_source(&p.delta),
                    })
                    .collect(),
                truncated: true,
            }
        ))
    );

    // A record cut to fit still decodes, and says it was cut.
    encode(
        &mut buf,
        &head,
        &Outgoing::End {
            record: &record(2000, &"x".repeat(60)),
            next: false,
        },
    );
    let Ok(Message {
        event: Event::End {
            sources, truncated, ..
        },
        ..
    }) = decode(buf.as_bytes())
    else {
        panic!("{buf}")
    };
    assert!(truncated && sources.len() > 90 && sources.len() < 2000);
}

const BEGIN: &str = r#"{"v":1,"ev":"begin","pid":4242,"tracker":1,"seq":0,"dropped":0,"kind":"epoch","name":"epoch","index":0,"depth":0,"t_ns":81234567890}"#;
const END: &str = r#"{"v":1,"ev":"end","pid":4242,"tracker":1,"seq":7,"dropped":2,"kind":"step","name":"step","index":3,"depth":1,"started_ns":81240000000,"ended_ns":81250000000,"next":true,"releases":0,"sources":[{"name":"rss","kind":"process","fidelity":"exact","used_start":104857600,"used_end":104857600,"peak":373293056,"delta_used":0,"delta_peaked":268435456}],"truncated":false}"#;

#[test]
fn messages_decode() {
    let m = decode(BEGIN.as_bytes()).unwrap();
    assert_eq!(
        (m.pid, m.kind, m.event),
        (
            4242,
            PhaseKind::Epoch,
            Event::Begin {
                t_ns: 81_234_567_890
            }
        )
    );
    let m = decode(END.as_bytes()).unwrap();
    assert_eq!((m.pid, m.seq, m.dropped, m.index), (4242, 7, 2, 3));
    let Event::End { sources, next, .. } = m.event else {
        panic!()
    };
    assert!(next);
    assert_eq!(sources[0].peak, 373_293_056);
    // Fields added within a version are ignored.
    let more = END.replace(r#""v":1,"#, r#""v":1,"later":[1,2],"#);
    assert!(decode(more.as_bytes()).is_ok());
}

const STEPS: &str = r#"{"v":1,"ev":"steps","pid":4242,"tracker":1,"seq":8,"dropped":3,"dropped_steps":40,"kind":"step","name":"step","index":4,"depth":1,"last":9,"count":6,"started_ns":81250000000,"ended_ns":81262000000,"next":true,"releases":0,"sources":[{"name":"rss","kind":"process","fidelity":"exact","used_start":104857600,"used_end":104857600,"peak":109051904,"delta_used":0,"delta_peaked":4194304,"index":7,"started_ns":81256000000,"ended_ns":81258000000}],"truncated":false}"#;

#[test]
fn batches_of_steps_decode_and_bad_ones_are_refused() {
    let m = decode(STEPS.as_bytes()).unwrap();
    assert_eq!((m.dropped, m.dropped_steps, m.index), (3, 40, 4));
    let Event::Steps {
        last, count, peaks, ..
    } = m.event
    else {
        panic!()
    };
    assert_eq!((last, count, peaks.len()), (9, 6, 1));
    assert_eq!((peaks[0].index, peaks[0].source.peak), (7, 109_051_904));
    for bad in [
        STEPS.replace(r#""last":9"#, r#""last":3"#),
        STEPS.replace(r#""count":6"#, r#""count":0"#),
        STEPS.replace(r#""index":7"#, r#""index":12"#),
        STEPS.replace(r#","started_ns":81256000000"#, ""),
        STEPS.replace(r#""kind":"step","name""#, r#""kind":"epoch","name""#),
        // A step's peak in an end message.
        END.replace(
            r#""delta_peaked":268435456}"#,
            r#""delta_peaked":1,"index":3,"started_ns":1,"ended_ns":2}"#,
        ),
    ] {
        assert_eq!(
            decode(bad.as_bytes()).err(),
            Some(Unreadable::Garbled),
            "{bad}"
        );
    }
}

#[test]
fn anything_else_is_refused_never_a_crash() {
    let garbled = [
        String::new(),
        "not json".into(),
        "{".into(),
        "[1,2]".into(),
        r#"{"v":"1"}"#.into(),
        r#"{"v":1}"#.into(),
        BEGIN.replace(r#""t_ns""#, r#""x_ns""#),
        BEGIN.replace("\"epoch\",\"name\"", "\"era\",\"name\""),
        BEGIN.replace(
            r#""name":"epoch""#,
            &format!(r#""name":"{}""#, "n".repeat(65)),
        ),
        BEGIN.replace(r#""name":"epoch""#, r#""name":"a\nb""#),
        BEGIN.replace(r#""ev":"begin""#, r#""ev":"middle""#),
        END.replace(r#""started_ns":81240000000"#, r#""started_ns":91240000000"#),
        END.replace(r#""pid":4242"#, r#""pid":-1"#),
        END.replace(r#""peak":373293056"#, r#""peak":-5"#),
    ];
    for g in &garbled {
        assert_eq!(decode(g.as_bytes()).err(), Some(Unreadable::Garbled), "{g}");
    }
    assert_eq!(decode(&[0xff, 0xfe, 0, 1]).err(), Some(Unreadable::Garbled));
    let v2 = BEGIN.replace(r#""v":1"#, r#""v":2"#);
    assert_eq!(decode(v2.as_bytes()).err(), Some(Unreadable::Version));
}
