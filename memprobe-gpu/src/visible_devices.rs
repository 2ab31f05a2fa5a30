//! `CUDA_VISIBLE_DEVICES`: which physical GPUs the process sees, in which
//! order, under which CUDA ordinals.

/// One device as CUDA numbers it: the entry at position `i` of the list that
/// [`map_visible_devices`] returns is CUDA device `i`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VisibleDevice {
    /// A whole physical GPU, by its NVML index (PCI bus order).
    Physical(u32),
    /// A MIG instance, by its `MIG-...` UUID as written in the variable.
    Mig(String),
}

/// Maps a `CUDA_VISIBLE_DEVICES` value to the devices CUDA would expose, in
/// CUDA ordinal order. Pure: it only looks at its arguments.
///
/// - `spec`: the variable's value; `None` when it is unset (every physical
///   device, in NVML order), `Some("")` hides every device.
/// - `physical_uuids`: the UUID (`GPU-...`) of each physical device in NVML
///   index order; `None` where it could not be read.
/// - `mig_exists`: whether a `MIG-...` UUID names an existing MIG instance.
///
/// Entries are separated by commas and may be
/// - an index into the physical devices (`0`, `3`), in PCI bus order (see the
///   crate documentation on `CUDA_DEVICE_ORDER`);
/// - a GPU UUID or a prefix of one that matches exactly one device
///   (`GPU-8f2c`, compared without regard to case);
/// - a MIG UUID (`MIG-<uuid>`, the R470+ form), matched exactly.
///
/// As in CUDA, the first invalid entry (malformed, out of range, unknown or
/// ambiguous UUID, or a device listed twice) hides itself and every entry
/// after it: `"0,7,1"` on a 2-GPU machine is just device 0. Blanks around
/// entries are ignored.
pub fn map_visible_devices(
    spec: Option<&str>,
    physical_uuids: &[Option<&str>],
    mut mig_exists: impl FnMut(&str) -> bool,
) -> Vec<VisibleDevice> {
    let spec = match spec {
        None => {
            return (0..physical_uuids.len() as u32)
                .map(VisibleDevice::Physical)
                .collect()
        }
        Some(s) => s,
    };
    let mut out = Vec::new();
    if spec.trim().is_empty() {
        return out;
    }
    for entry in spec.split(',') {
        let entry = entry.trim();
        let device = match resolve_entry(entry, physical_uuids, &mut mig_exists) {
            Some(d) => d,
            None => break,
        };
        if out.contains(&device) {
            break;
        }
        out.push(device);
    }
    out
}

fn resolve_entry(
    entry: &str,
    physical_uuids: &[Option<&str>],
    mig_exists: &mut impl FnMut(&str) -> bool,
) -> Option<VisibleDevice> {
    if !entry.is_empty() && entry.bytes().all(|b| b.is_ascii_digit()) {
        let index: u32 = entry.parse().ok()?;
        return ((index as usize) < physical_uuids.len()).then_some(VisibleDevice::Physical(index));
    }
    if has_prefix(entry, "GPU-") && entry.len() > 4 {
        let mut found = None;
        for (i, uuid) in physical_uuids.iter().enumerate() {
            if uuid.is_some_and(|u| has_prefix(u, entry)) {
                if found.is_some() {
                    return None; // ambiguous prefix
                }
                found = Some(i as u32);
            }
        }
        return found.map(VisibleDevice::Physical);
    }
    if has_prefix(entry, "MIG-") && entry.len() > 4 && mig_exists(entry) {
        return Some(VisibleDevice::Mig(entry.to_string()));
    }
    None
}

/// Whether `s` starts with `prefix`, ignoring ASCII case.
fn has_prefix(s: &str, prefix: &str) -> bool {
    s.len() >= prefix.len() && s.as_bytes()[..prefix.len()].eq_ignore_ascii_case(prefix.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::VisibleDevice::{Mig, Physical};
    use super::*;

    const U: [Option<&str>; 3] = [
        Some("GPU-11111111-aaaa-4000-8000-000000000000"),
        Some("GPU-12222222-bbbb-4000-8000-000000000001"),
        Some("GPU-33333333-cccc-4000-8000-000000000002"),
    ];

    fn map(spec: Option<&str>) -> Vec<VisibleDevice> {
        map_visible_devices(spec, &U, |m| m == "MIG-aaaa-bbbb")
    }

    #[test]
    fn unset_is_all_in_order() {
        assert_eq!(map(None), vec![Physical(0), Physical(1), Physical(2)]);
        assert_eq!(map_visible_devices(None, &[], |_| false), vec![]);
    }

    #[test]
    fn empty_hides_everything() {
        assert_eq!(map(Some("")), vec![]);
        assert_eq!(map(Some("  ")), vec![]);
    }

    #[test]
    fn indices_and_reordering() {
        assert_eq!(map(Some("2,0")), vec![Physical(2), Physical(0)]);
        assert_eq!(map(Some(" 1 , 2 ")), vec![Physical(1), Physical(2)]);
        assert_eq!(map(Some("1")), vec![Physical(1)]);
    }

    #[test]
    fn invalid_entry_hides_the_rest() {
        assert_eq!(map(Some("0,7,1")), vec![Physical(0)]);
        assert_eq!(map(Some("1,x,0")), vec![Physical(1)]);
        assert_eq!(map(Some("-1")), vec![]);
        assert_eq!(map(Some("-1,0")), vec![]);
        assert_eq!(map(Some("0,,1")), vec![Physical(0)]);
        assert_eq!(map(Some("+1")), vec![]);
        assert_eq!(map(Some("99999999999999999999")), vec![]);
        assert_eq!(map(Some("1,GPU-9")), vec![Physical(1)]);
    }

    #[test]
    fn duplicates_are_invalid() {
        assert_eq!(map(Some("0,0,1")), vec![Physical(0)]);
        assert_eq!(map(Some("1,GPU-12222222")), vec![Physical(1)]);
    }

    #[test]
    fn uuids_and_prefixes() {
        assert_eq!(
            map(Some("GPU-33333333-cccc-4000-8000-000000000002")),
            vec![Physical(2)]
        );
        assert_eq!(map(Some("GPU-333,GPU-11")), vec![Physical(2), Physical(0)]);
        assert_eq!(map(Some("gpu-33333333-CCCC")), vec![Physical(2)]);
        // "GPU-1" matches devices 0 and 1: ambiguous, so invalid.
        assert_eq!(map(Some("2,GPU-1,0")), vec![Physical(2)]);
        assert_eq!(map(Some("GPU-")), vec![]);
        assert_eq!(map(Some("0,GPU-12")), vec![Physical(0), Physical(1)]);
    }

    #[test]
    fn unreadable_uuids_never_match() {
        let uuids = [None, Some("GPU-abc")];
        assert_eq!(
            map_visible_devices(Some("GPU-a"), &uuids, |_| false),
            vec![Physical(1)]
        );
        assert_eq!(
            map_visible_devices(Some("0,1"), &uuids, |_| false),
            vec![Physical(0), Physical(1)]
        );
    }

    #[test]
    fn mig_uuids() {
        assert_eq!(
            map(Some("MIG-aaaa-bbbb")),
            vec![Mig("MIG-aaaa-bbbb".into())]
        );
        assert_eq!(
            map(Some("MIG-aaaa-bbbb,1")),
            vec![Mig("MIG-aaaa-bbbb".into()), Physical(1)]
        );
        assert_eq!(map(Some("MIG-nope,1")), vec![]);
        assert_eq!(
            map(Some("MIG-aaaa-bbbb,MIG-aaaa-bbbb")),
            vec![Mig("MIG-aaaa-bbbb".into())]
        );
        assert_eq!(map(Some("MIG-")), vec![]);
    }
}
