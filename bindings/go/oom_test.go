package memprobe_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"memprobe.dev/memprobe"
)

const gib = uint64(1) << 30

func readReport(t *testing.T, path string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatalf("%s is not JSON: %v\n%s", path, err, b)
	}
	if doc["format"] != "memprobe-oom-report" {
		t.Fatalf("format %v", doc["format"])
	}
	return doc
}

func TestOOMReportFromTheCaller(t *testing.T) {
	alloc, err := memprobe.NewPushed("alloc")
	if err != nil {
		t.Fatal(err)
	}
	defer alloc.Close()
	tr, err := memprobe.NewTracker(alloc)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()

	// Wrong orders before any configuration.
	if err := tr.ReportOOM(0, gib, ""); !errors.Is(err, memprobe.ErrWrongOrder) {
		t.Fatalf("report before configuration: %v", err)
	}
	if _, err := tr.OOMStatus(); !errors.Is(err, memprobe.ErrWrongOrder) {
		t.Fatalf("status before configuration: %v", err)
	}
	if err := tr.RearmOOMReport(); !errors.Is(err, memprobe.ErrWrongOrder) {
		t.Fatalf("rearm before configuration: %v", err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "oom.json")
	if err := tr.SetOOMReport(memprobe.OOMReportOptions{Path: path}); !errors.Is(err, memprobe.ErrInvalidArgument) {
		t.Fatalf("no trigger: %v", err)
	}
	// No interposer in the test binary: the driver's trigger is unavailable.
	err = tr.SetOOMReport(memprobe.OOMReportOptions{Triggers: memprobe.OOMTriggerDriver, Path: path})
	if !errors.Is(err, memprobe.ErrUnavailable) || !strings.Contains(err.Error(), "LD_PRELOAD") {
		t.Fatalf("driver trigger without the interposer: %v", err)
	}

	var got []string
	err = tr.SetOOMReport(memprobe.OOMReportOptions{
		Triggers:  memprobe.OOMTriggerCaller,
		Path:      path,
		KeepEnded: 2,
		Callback:  func(j, s string) { got = append(got, s) },
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.SetOOMReport(memprobe.OOMReportOptions{Triggers: memprobe.OOMTriggerCaller, Path: path}); !errors.Is(err, memprobe.ErrWrongOrder) {
		t.Fatalf("configured twice: %v", err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(tr.Begin(memprobe.Epoch, ""))
	must(tr.Begin(memprobe.Step, ""))
	for i := uint64(1); i <= 3; i++ {
		must(alloc.Push(i * gib))
		must(alloc.Push(gib / 2))
		if _, err := tr.Next(memprobe.Step, ""); err != nil {
			t.Fatal(err)
		}
	}
	must(alloc.Push(7 * gib))
	if err := tr.ReportOOM(-2, 1, ""); !errors.Is(err, memprobe.ErrInvalidID) {
		t.Fatalf("device -2: %v", err)
	}
	must(tr.ReportOOM(0, 2*gib, "out of memory in step 3"))
	for i := 0; i < 10; i++ {
		must(tr.ReportOOM(0, 2*gib, "retry"))
	}
	st, err := tr.OOMStatus()
	must(err)
	if st.Armed || st.ReportsWritten != 1 || st.TriggersSeen != 11 || st.LaterTriggers != 10 || st.Triggers != memprobe.OOMTriggerCaller {
		t.Fatalf("status %+v", st)
	}
	if len(got) != 1 || !strings.Contains(got[0], "caller asked 2.00 GiB on GPU 0") {
		t.Fatalf("callback got %q", got)
	}
	doc := readReport(t, path)
	open := doc["open_phases"].(map[string]any)["phases"].([]any)
	step := open[1].(map[string]any)
	if step["kind"] != "step" || step["index"] != float64(3) {
		t.Fatalf("open step %v", step)
	}
	peak := step["sources"].([]any)[0].(map[string]any)["peak"]
	if peak != float64(7*gib) {
		t.Fatalf("open step peak %v", peak)
	}
	ended := doc["ended_phases"].(map[string]any)
	if ended["kept"] != float64(2) || len(ended["phases"].([]any)) != 2 {
		t.Fatalf("ended %v", ended)
	}

	// Re-armed: the burst settles into the file; a framework's report with
	// its caches replaces it.
	must(tr.RearmOOMReport())
	later := readReport(t, path)["later_triggers"].(map[string]any)
	if later["count"] != float64(10) {
		t.Fatalf("later %v", later)
	}
	must(tr.ReportOOMEvent(memprobe.OOMEvent{
		Device:           1,
		RequestedBytes:   gib,
		ReportedBy:       "torch",
		HasDeviceFigures: true,
		DeviceTotalBytes: 80 * gib,
		DeviceFreeBytes:  gib / 4,
		Caches: []memprobe.OOMCache{{
			Device:          1,
			Valid:           memprobe.OOMCacheReserved | memprobe.OOMCacheAllocated | memprobe.OOMCacheReleasable,
			ReservedBytes:   70 * gib,
			AllocatedBytes:  60 * gib,
			ReleasableBytes: 3 * gib,
		}},
		LiveBlocksJSON: `{"schema": "memprobe.torch_attribution/1", "kind": "oom", "requested_bytes": 1073741824,
			"blocks": [{"bytes": 536870912, "frames": [{"file": "train.py", "line": 42, "function": "forward"}]}],
			"segments": [{"address": 1, "bytes": 805306368, "allocated": 536870912, "stream": 0}]}`,
	}))
	doc = readReport(t, path)
	live := doc["live_blocks"].(map[string]any)
	if live["requested_bytes"] != float64(gib) || len(live["blocks"].([]any)) != 1 || doc["live_blocks_error"] != nil {
		t.Fatalf("live blocks %v, error %v", live, doc["live_blocks_error"])
	}
	failed := doc["failed_allocation"].(map[string]any)
	if failed["reported_by"] != "torch" || failed["device_free_bytes"] != float64(gib/4) {
		t.Fatalf("failed %v", failed)
	}
	cache := doc["caches"].([]any)[0].(map[string]any)
	if cache["releasable_bytes"] != float64(3*gib) || cache["framework"] != "torch" {
		t.Fatalf("cache %v", cache)
	}
	must(tr.ClearOOMReport())
	must(tr.ClearOOMReport())
	if _, err := tr.OOMStatus(); !errors.Is(err, memprobe.ErrWrongOrder) {
		t.Fatalf("status after clear: %v", err)
	}
	must(tr.Close())
	if err := tr.ReportOOM(0, 1, ""); !errors.Is(err, memprobe.ErrInvalidHandle) {
		t.Fatalf("report after close: %v", err)
	}
	if len(tr.Errors()) != 0 {
		t.Fatal(tr.Errors())
	}
}
