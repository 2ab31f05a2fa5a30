//! PyTorch's live blocks at each epoch's peak step and at each PyTorch
//! out-of-memory error, as the command's integrations wrote them
//! (`memprobe.torch_attribution/1` records: one JSON file per epoch,
//! `epoch-<E>-rank-<R>.json`, and per OOM, `oom-<N>-rank-<R>.json`).
//!
//! `memprobe run` names the directory in `MEMPROBE_ATTRIBUTION_DIR` for the
//! command: a private one it makes before the spawn (0700, in the temporary
//! directory: records are files, not shared memory) and removes at the end,
//! since everything worth keeping goes into the run's outputs; or the user's own, when the variable
//! is already set (then memprobe reads only the files written during the
//! run, and leaves them). At the end it reads the records: a file that is
//! not a record, too large, or whose blocks do not add up is skipped with a
//! warning, never taken half. Bounded: [`MAX_FILES`] files, each at most
//! [`MAX_FILE_BYTES`]; the JSON keeps each record's [`MAX_BLOCKS`] largest
//! blocks (the rest folded into its "rest", so the sum still holds).

use crate::units;
use serde::Serialize;
use serde_json::Value;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// The variable the writers read.
pub(crate) const ENV: &str = "MEMPROBE_ATTRIBUTION_DIR";
/// The records' schema name.
pub(crate) const SCHEMA: &str = "memprobe.torch_attribution/1";
/// Files read at most.
pub(crate) const MAX_FILES: usize = 1024;
/// A record's size at most (the writers' own bound).
pub(crate) const MAX_FILE_BYTES: u64 = 256 * 1024;
/// Blocks kept per record in the run's JSON.
pub(crate) const MAX_BLOCKS: usize = 10;
/// Frames kept per block in the run's JSON.
pub(crate) const MAX_FRAMES: usize = 8;

/// The directory the command writes its records into.
pub(crate) struct AttributionDir {
    path: PathBuf,
    /// Made by memprobe (removed on drop), not the user's.
    owned: bool,
    /// Files older than this are not the run's.
    since: SystemTime,
}

impl AttributionDir {
    /// The user's directory when `MEMPROBE_ATTRIBUTION_DIR` is set, else a
    /// private one made now.
    pub(crate) fn prepare() -> Result<AttributionDir, String> {
        let since = SystemTime::now();
        if let Some(v) = std::env::var_os(ENV).filter(|v| !v.is_empty()) {
            return Ok(AttributionDir {
                path: PathBuf::from(v),
                owned: false,
                since,
            });
        }
        // SAFETY: getuid cannot fail.
        let uid = unsafe { libc::getuid() };
        let path =
            std::env::temp_dir().join(format!("memprobe-attribution-{uid}-{}", std::process::id()));
        // One left by an earlier memprobe with this pid is ours to replace.
        let _ = std::fs::remove_dir_all(&path);
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(AttributionDir {
            path,
            owned: true,
            since,
        })
    }

    /// The variable the command starts with.
    pub(crate) fn env(&self) -> (OsString, Option<OsString>) {
        (ENV.into(), Some(self.path.as_os_str().to_owned()))
    }

    /// The records the run's processes wrote, and a warning per file
    /// skipped.
    pub(crate) fn read(&self) -> (Vec<TorchRecord>, Vec<String>) {
        read_dir(&self.path, (!self.owned).then_some(self.since))
    }
}

impl Drop for AttributionDir {
    fn drop(&mut self) {
        if self.owned {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// One source frame of a block.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Frame {
    pub(crate) file: String,
    pub(crate) line: u64,
    pub(crate) function: String,
}

/// One live block.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Block {
    pub(crate) bytes: u64,
    pub(crate) stream: Option<u64>,
    pub(crate) address: Option<u64>,
    /// The user's frames first, at most [`MAX_FRAMES`].
    pub(crate) frames: Vec<Frame>,
    /// The forward module's name, for a frameless backward block.
    pub(crate) module: Option<String>,
}

/// The blocks not listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Rest {
    /// Null when the history lost entries (never guessed).
    pub(crate) bytes: Option<u64>,
    /// Null, like `bytes`, when the history lost entries.
    pub(crate) blocks: Option<u64>,
}

/// Whether torch's history held everything the replay needed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct History {
    pub(crate) complete: bool,
    pub(crate) entries: u64,
    pub(crate) lost_entries: bool,
    /// Why the replay could not name blocks, as the writer said.
    pub(crate) reason: Option<String>,
}

/// One record as the run's JSON keeps it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct TorchRecord {
    /// `epoch_peak` or `oom`.
    pub(crate) kind: String,
    pub(crate) file: String,
    /// The number in the file's name: the epoch, or the OOM's count.
    #[serde(skip)]
    pub(crate) number: u64,
    pub(crate) rank: u64,
    pub(crate) epoch: Option<u64>,
    pub(crate) step: Option<u64>,
    pub(crate) stage: Option<String>,
    pub(crate) device: Option<u64>,
    pub(crate) peak_bytes: Option<u64>,
    pub(crate) requested_bytes: Option<u64>,
    /// Largest first, at most [`MAX_BLOCKS`].
    pub(crate) blocks: Vec<Block>,
    pub(crate) rest: Rest,
    pub(crate) history: History,
    /// The writer trimmed frames or blocks to stay within its bound, or
    /// this run's JSON folded blocks into `rest`.
    pub(crate) truncated: bool,
    pub(crate) cost_ms: Option<f64>,
}

/// What a file's name says it is: (kind, number, rank, device). A process
/// measuring several devices adds `-device-<D>` for all but one.
fn parse_name(name: &str) -> Option<(&'static str, u64, u64, Option<u64>)> {
    let stem = name.strip_suffix(".json")?;
    let (kind, rest) = if let Some(r) = stem.strip_prefix("epoch-") {
        ("epoch_peak", r)
    } else {
        ("oom", stem.strip_prefix("oom-")?)
    };
    let (n, rest) = rest.split_once("-rank-")?;
    let (rank, device) = match rest.split_once("-device-") {
        Some((r, d)) => (r, Some(d.parse().ok()?)),
        None => (rest, None),
    };
    Some((kind, n.parse().ok()?, rank.parse().ok()?, device))
}

/// The records in `dir` (files modified before `since` left out), ordered
/// by kind, rank and number; a warning per file skipped.
pub(crate) fn read_dir(dir: &Path, since: Option<SystemTime>) -> (Vec<TorchRecord>, Vec<String>) {
    let mut warnings = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return (Vec::new(), warnings);
    };
    type Named = (&'static str, u64, u64, Option<u64>, PathBuf, String);
    let mut files: Vec<Named> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_owned();
            // Temporary names and anything else: not records.
            let (kind, n, rank, device) = parse_name(&name)?;
            Some((kind, rank, n, device, e.path(), name))
        })
        .collect();
    // A user's directory keeps earlier runs' files: they leave before the
    // bound, so that they never crowd out this run's.
    if let Some(s) = since {
        files.retain(|f| {
            std::fs::metadata(&f.4)
                .and_then(|m| m.modified())
                .map_or(true, |m| m >= s)
        });
    }
    files.sort();
    if files.len() > MAX_FILES {
        // Said as the caller says every warning: "record FILE: WHY (skipped)".
        let (first, last) = (&files[MAX_FILES].5, &files[files.len() - 1].5);
        warnings.push(format!(
            "{first} to {last}: past the first {MAX_FILES} of {} records",
            files.len()
        ));
        files.truncate(MAX_FILES);
    }
    let mut records = Vec::new();
    for (kind, rank, n, device, path, name) in files {
        let parsed = read_bounded(&path)
            .and_then(|b| serde_json::from_slice::<Value>(&b).map_err(|e| e.to_string()))
            .and_then(|v| record(&v, (kind, n, rank, device), &name));
        match parsed {
            Ok(r) => records.push(r),
            Err(e) => warnings.push(format!("{name}: {e}")),
        }
    }
    (records, warnings)
}

/// A record file's bytes, at most [`MAX_FILE_BYTES`]. Only a regular file:
/// a FIFO given a record's name would block the read forever. The bound
/// holds on what is read, not on a size seen before, since a file may grow.
fn read_bounded(path: &Path) -> Result<Vec<u8>, String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    // O_NONBLOCK: opening a FIFO with no writer would block before the
    // check below could refuse it.
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| e.to_string())?;
    let meta = f.metadata().map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    let mut bytes = Vec::new();
    f.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(format!(
            "{} is over the records' bound of {}",
            units::bytes(meta.len().max(bytes.len() as u64)),
            units::bytes(MAX_FILE_BYTES)
        ));
    }
    Ok(bytes)
}

fn uint(v: &Value, key: &str) -> Result<Option<u64>, String> {
    match &v[key] {
        Value::Null => Ok(None),
        x => x
            .as_u64()
            .map(Some)
            .ok_or_else(|| format!("\"{key}\" is not a non-negative integer")),
    }
}

fn block(v: &Value) -> Result<Block, String> {
    let frames = match &v["frames"] {
        Value::Null => Vec::new(),
        Value::Array(a) => a
            .iter()
            .take(MAX_FRAMES)
            .map(|f| {
                Ok(Frame {
                    file: f["file"].as_str().ok_or("a frame without \"file\"")?.into(),
                    line: uint(f, "line")?.unwrap_or(0),
                    function: f["function"].as_str().unwrap_or("").into(),
                })
            })
            .collect::<Result<_, String>>()?,
        _ => return Err("a block's \"frames\" is not an array".into()),
    };
    Ok(Block {
        bytes: uint(v, "bytes")?.ok_or("a block without \"bytes\"")?,
        stream: uint(v, "stream")?,
        address: uint(v, "address")?,
        frames,
        module: v["module"].as_str().map(str::to_owned),
    })
}

/// A record from its JSON, checked against the contract.
fn record(
    v: &Value,
    (kind, n, rank, device): (&str, u64, u64, Option<u64>),
    file: &str,
) -> Result<TorchRecord, String> {
    if v["schema"] != SCHEMA {
        return Err(format!("not a {SCHEMA} record"));
    }
    if v["kind"] != kind {
        return Err(format!("kind {} in a file named for {kind}", v["kind"]));
    }
    // The name and the content must tell the same story.
    if uint(v, "rank")?.is_some_and(|r| r != rank) {
        return Err(format!(
            "rank {} in a file named for rank {rank}",
            v["rank"]
        ));
    }
    if kind == "epoch_peak" && uint(v, "epoch")? != Some(n) {
        return Err(format!(
            "epoch {} in a file named for epoch {n}",
            v["epoch"]
        ));
    }
    if let Some(d) = device.filter(|&d| uint(v, "device").ok().flatten() != Some(d)) {
        return Err(format!(
            "device {} in a file named for device {d}",
            v["device"]
        ));
    }
    let mut blocks = v["blocks"]
        .as_array()
        .ok_or("no \"blocks\" array")?
        .iter()
        .map(block)
        .collect::<Result<Vec<_>, _>>()?;
    let h = &v["history"];
    let history = History {
        complete: h["complete"].as_bool().ok_or("no \"history.complete\"")?,
        entries: uint(h, "entries")?.unwrap_or(0),
        lost_entries: h["lost_entries"].as_bool().unwrap_or(false),
        reason: h["reason"].as_str().map(str::to_owned),
    };
    let mut rest = Rest {
        bytes: uint(&v["rest"], "bytes")?,
        blocks: uint(&v["rest"], "blocks")?,
    };
    let peak = uint(v, "peak_bytes")?;
    if history.complete {
        let listed: u64 = blocks.iter().map(|b| b.bytes).sum();
        let rest_bytes = rest
            .bytes
            .ok_or("complete history but \"rest.bytes\" null")?;
        if kind == "epoch_peak" && peak != Some(listed + rest_bytes) {
            return Err(format!(
                "blocks ({listed}) + rest ({rest_bytes}) != peak_bytes ({})",
                peak.map_or("null".into(), |p| p.to_string())
            ));
        }
    } else if !blocks.is_empty() || rest.bytes.is_some() {
        return Err("incomplete history but blocks listed (they would be a guess)".into());
    }
    blocks.sort_by_key(|b| std::cmp::Reverse(b.bytes));
    let mut truncated = v["truncated"].as_bool().unwrap_or(false);
    if blocks.len() > MAX_BLOCKS {
        let folded = blocks.split_off(MAX_BLOCKS);
        rest.blocks = Some(rest.blocks.unwrap_or(0) + folded.len() as u64);
        rest.bytes = rest
            .bytes
            .map(|b| b + folded.iter().map(|f| f.bytes).sum::<u64>());
        truncated = true;
    }
    Ok(TorchRecord {
        kind: kind.into(),
        file: file.into(),
        number: n,
        rank,
        epoch: uint(v, "epoch")?,
        step: uint(v, "step")?,
        stage: v["stage"].as_str().map(str::to_owned),
        device: uint(v, "device")?,
        peak_bytes: peak,
        requested_bytes: uint(v, "requested_bytes")?,
        blocks,
        rest,
        history,
        truncated,
        cost_ms: v["cost_ms"].as_f64(),
    })
}

/// Where a block was allocated, in a few words: its first frame, or the
/// forward module of a frameless backward block.
pub(crate) fn place(b: &Block) -> String {
    match (b.frames.first(), &b.module) {
        (Some(f), _) => {
            let file = f.file.rsplit('/').next().unwrap_or(&f.file);
            if f.function.is_empty() {
                format!("{file}:{}", f.line)
            } else {
                format!("{file}:{} {}", f.line, f.function)
            }
        }
        (None, Some(m)) => format!("backward of {m}"),
        (None, None) => "no frame".into(),
    }
}

/// `BYTES place, ...` of a record's `n` largest blocks, then its rest.
pub(crate) fn top_blocks(r: &TorchRecord, n: usize) -> String {
    if !r.history.complete {
        return format!(
            "blocks unknown: {}",
            r.history
                .reason
                .as_deref()
                .unwrap_or("torch's history lost entries the replay needed")
        );
    }
    let mut parts: Vec<String> = r
        .blocks
        .iter()
        .take(n)
        .map(|b| format!("{} {}", units::bytes(b.bytes), place(b)))
        .collect();
    let hidden = &r.blocks[n.min(r.blocks.len())..];
    let rest_bytes = r.rest.bytes.unwrap_or(0) + hidden.iter().map(|b| b.bytes).sum::<u64>();
    let rest_blocks = r.rest.blocks.unwrap_or(0) + hidden.len() as u64;
    if rest_blocks > 0 {
        parts.push(format!(
            "rest {} in {rest_blocks} block{}",
            units::bytes(rest_bytes),
            if rest_blocks == 1 { "" } else { "s" }
        ));
    }
    if parts.is_empty() {
        "no live blocks".into()
    } else {
        parts.join(", ")
    }
}

/// The summary's line for one record (after its label).
pub(crate) fn summary(r: &TorchRecord) -> String {
    let at = [
        r.step.map(|s| format!("step {s}")),
        r.stage.clone(),
        r.device.map(|d| format!("GPU {d}")),
    ]
    .into_iter()
    .flatten()
    .collect::<Vec<_>>()
    .join(", ");
    let head = match r.kind.as_str() {
        "oom" => format!(
            "asked {}{}",
            r.requested_bytes.map_or_else(|| "?".into(), units::bytes),
            if at.is_empty() {
                String::new()
            } else {
                format!(" ({at})")
            }
        ),
        _ => format!(
            "{} {}",
            at,
            r.peak_bytes.map_or_else(|| "?".into(), units::bytes)
        ),
    };
    format!("{head}: {}", top_blocks(r, 3))
}

/// The summary's label for one record.
pub(crate) fn label(r: &TorchRecord, ranks: bool) -> String {
    let rank = if ranks {
        format!(" rank {}", r.rank)
    } else {
        String::new()
    };
    match r.kind.as_str() {
        "oom" => format!("torch OOM {}{rank}", r.number),
        _ => format!(
            "torch epoch {}{rank}",
            r.epoch.map_or_else(|| "?".into(), |e| e.to_string())
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "memprobe-attribution-test-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn epoch(epoch: u64, blocks: &[(u64, &str)], rest: u64, peak: u64) -> Value {
        serde_json::json!({
            "schema": SCHEMA, "kind": "epoch_peak", "rank": 0, "epoch": epoch,
            "step": 812, "stage": "train", "device": 0, "peak_bytes": peak,
            "requested_bytes": null,
            "blocks": blocks.iter().map(|(b, f)| serde_json::json!({
                "bytes": b, "stream": 0, "address": 140000000,
                "frames": [{"file": format!("/home/u/{f}"), "line": 42, "function": "forward"}],
                "module": null})).collect::<Vec<_>>(),
            "rest": {"bytes": rest, "blocks": 3},
            "segments": null,
            "history": {"complete": true, "entries": 1234, "lost_entries": false},
            "cost_ms": 3.2
        })
    }

    #[test]
    fn good_records_are_read_and_bad_files_are_skipped_with_a_reason() {
        let d = scratch("mixed");
        let w = |name: &str, v: &Value| std::fs::write(d.join(name), v.to_string()).unwrap();
        w(
            "epoch-0-rank-0.json",
            &epoch(
                0,
                &[(1 << 30, "train.py"), (512 << 20, "model.py")],
                160,
                (1 << 30) + (512 << 20) + 160,
            ),
        );
        // Blocks and rest that do not make the peak: not taken.
        w(
            "epoch-1-rank-0.json",
            &epoch(1, &[(100, "train.py")], 10, 999),
        );
        // A ring buffer that lost entries: no blocks, rest null.
        let mut lost = epoch(2, &[], 0, 4096);
        lost["history"]["complete"] = false.into();
        lost["history"]["lost_entries"] = true.into();
        lost["rest"]["bytes"] = Value::Null;
        w("epoch-2-rank-0.json", &lost);
        // The same with blocks listed would be a guess.
        let mut guessed = epoch(3, &[(4096, "train.py")], 0, 4096);
        guessed["history"]["complete"] = false.into();
        w("epoch-3-rank-0.json", &guessed);
        // Cut short (a writer that did not rename), and a temporary name.
        std::fs::write(
            d.join("epoch-4-rank-0.json"),
            b"{\"schema\": \"memprobe.tor",
        )
        .unwrap();
        std::fs::write(d.join(".epoch-5-rank-0.json.tmp"), b"{").unwrap();
        std::fs::write(d.join("epoch-6-rank-0.json"), vec![b' '; 300 * 1024]).unwrap();
        // Twelve blocks: ten kept, two folded into the rest.
        let many: Vec<(u64, &str)> = (1..=12).map(|i| (i * 1000, "x.py")).collect();
        let sum: u64 = many.iter().map(|b| b.0).sum();
        let mut e7 = epoch(7, &many, 5, sum + 5);
        e7["rank"] = 1.into();
        w("epoch-7-rank-1.json", &e7);
        // A name that says another epoch than the record.
        w("epoch-8-rank-0.json", &epoch(9, &[], 0, 0));
        // A second device of the same process and epoch, named so; and one
        // whose name and content disagree.
        let mut dev1 = epoch(0, &[(4096, "train.py")], 0, 4096);
        dev1["device"] = 1.into();
        w("epoch-0-rank-0-device-1.json", &dev1);
        w("epoch-0-rank-0-device-2.json", &dev1);
        let mut oom = epoch(0, &[(2 << 30, "train.py")], 0, 0);
        oom["kind"] = "oom".into();
        oom["peak_bytes"] = Value::Null;
        oom["requested_bytes"] = (1u64 << 30).into();
        w("oom-0-rank-0.json", &oom);

        let (records, warnings) = read_dir(&d, None);
        let names: Vec<&str> = records.iter().map(|r| r.file.as_str()).collect();
        assert_eq!(
            names,
            vec![
                "epoch-0-rank-0.json",
                "epoch-0-rank-0-device-1.json",
                "epoch-2-rank-0.json",
                "epoch-7-rank-1.json",
                "oom-0-rank-0.json"
            ],
            "{warnings:#?}"
        );
        assert_eq!(warnings.len(), 6, "{warnings:#?}");
        assert!(warnings
            .iter()
            .any(|w| w == "epoch-0-rank-0-device-2.json: device 1 in a file named for device 2"));
        assert!(warnings
            .iter()
            .any(|w| w == "epoch-8-rank-0.json: epoch 9 in a file named for epoch 8"));
        assert!(warnings
            .iter()
            .any(|w| w
                .starts_with("epoch-1-rank-0.json: blocks (100) + rest (10) != peak_bytes (999)")));
        assert!(warnings
            .iter()
            .any(|w| w.starts_with("epoch-3-rank-0.json: incomplete history")));
        assert!(
            warnings
                .iter()
                .any(|w| w.starts_with("epoch-4-rank-0.json: EOF")),
            "{warnings:#?}"
        );
        assert!(warnings
            .iter()
            .any(|w| w.contains("over the records' bound")));

        let e0 = &records[0];
        assert_eq!(
            summary(e0),
            "step 812, train, GPU 0 1.50 GiB: 1.00 GiB train.py:42 forward, 512 MiB model.py:42 forward, rest 160 B in 3 blocks"
        );
        assert_eq!(label(e0, false), "torch epoch 0");
        assert_eq!(
            summary(&records[2]),
            "step 812, train, GPU 0 4.00 KiB: blocks unknown: torch's history lost entries the replay needed"
        );
        assert_eq!(records[1].device, Some(1));
        let e7 = &records[3];
        assert_eq!(e7.blocks.len(), MAX_BLOCKS);
        assert!(e7.truncated);
        assert_eq!(
            (e7.rest.blocks, e7.rest.bytes),
            (Some(5), Some(1000 + 2000 + 5))
        );
        let kept: u64 = e7.blocks.iter().map(|b| b.bytes).sum();
        assert_eq!(Some(kept + e7.rest.bytes.unwrap()), e7.peak_bytes);
        assert_eq!(label(e7, true), "torch epoch 7 rank 1");
        assert_eq!(label(&records[4], false), "torch OOM 0");
        assert!(summary(&records[4])
            .starts_with("asked 1.00 GiB (step 812, train, GPU 0): 2.00 GiB train.py:42 forward"));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_users_directory_is_read_for_this_runs_files_and_kept() {
        let d = scratch("user");
        std::fs::write(
            d.join("epoch-0-rank-0.json"),
            epoch(0, &[], 0, 0).to_string(),
        )
        .unwrap();
        let later = SystemTime::now() + std::time::Duration::from_secs(3600);
        assert!(read_dir(&d, Some(later)).0.is_empty());
        assert_eq!(read_dir(&d, None).0.len(), 1);
        assert!(d.exists());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn earlier_runs_files_never_crowd_out_this_runs() {
        let d = scratch("crowd");
        for e in 0..=MAX_FILES as u64 {
            let old = epoch(e, &[], 0, 0).to_string();
            std::fs::write(d.join(format!("epoch-{e}-rank-0.json")), old).unwrap();
        }
        let since = SystemTime::now() + std::time::Duration::from_secs(1);
        // This run's record sorts after every earlier one.
        let new = d.join("epoch-5000-rank-0.json");
        std::fs::write(&new, epoch(5000, &[], 0, 0).to_string()).unwrap();
        std::fs::File::options()
            .write(true)
            .open(&new)
            .unwrap()
            .set_modified(since + std::time::Duration::from_secs(1))
            .unwrap();
        let (records, warnings) = read_dir(&d, Some(since));
        let names: Vec<&str> = records.iter().map(|r| r.file.as_str()).collect();
        assert_eq!(names, vec!["epoch-5000-rank-0.json"], "{warnings:#?}");
        // Read whole, the same directory is bounded and says so.
        let (records, warnings) = read_dir(&d, None);
        assert_eq!(records.len(), MAX_FILES, "{warnings:#?}");
        assert!(
            warnings.iter().any(|w| w
                == "epoch-1024-rank-0.json to epoch-5000-rank-0.json: past the first 1024 of 1026 records"),
            "{warnings:#?}"
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_fifo_named_as_a_record_is_refused_not_waited_on() {
        let d = scratch("fifo");
        let path = d.join("epoch-0-rank-0.json");
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let (records, warnings) = read_dir(&d, None);
        assert!(records.is_empty());
        assert_eq!(
            warnings,
            vec!["epoch-0-rank-0.json: not a regular file".to_string()]
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_frameless_backward_block_is_named_by_its_module() {
        let b = Block {
            bytes: 1,
            stream: None,
            address: None,
            frames: vec![],
            module: Some("encoder.layer1".into()),
        };
        assert_eq!(place(&b), "backward of encoder.layer1");
        assert_eq!(place(&Block { module: None, ..b }), "no frame");
    }
}
