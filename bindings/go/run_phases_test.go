package memprobe

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The training loop run under `memprobe run` by TestRunPhases: this test
// binary, re-executed with runPhasesChild set, runs only
// TestRunPhasesChild.
const runPhasesChild = "MEMPROBE_GO_RUN_PHASES_CHILD"

const (
	epochs, steps, spikeEpoch, spikeStep = 3, 8, 1, 5
	spikeBytes                           = 256 * MiB
)

func spikeMemory(t *testing.T, n int) {
	b, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	ok(t, err)
	for i := 0; i < n; i += 4096 {
		b[i] = 1
	}
	ok(t, syscall.Munmap(b))
}

// TestRunPhasesChild is the training loop: epochs of steps, an evaluation
// stream after each, a "checkpoint" custom phase, and a spike in epoch 1,
// step 5 (the tracker's step 13). Outside TestRunPhases it does nothing.
func TestRunPhasesChild(t *testing.T) {
	if os.Getenv(runPhasesChild) == "" {
		return
	}
	rss := must(NewProcess())(t)
	defer rss.Close()
	tr := must(NewTracker(rss))(t)
	defer tr.Close()
	for e := 0; e < epochs; e++ {
		ok(t, tr.Begin(Epoch, ""))
		ok(t, tr.Begin(Step, ""))
		for s := 0; s < steps; s++ {
			time.Sleep(20 * time.Millisecond)
			spiked := e == spikeEpoch && s == spikeStep
			if spiked {
				spikeMemory(t, spikeBytes)
			}
			var r PhaseRecord
			if s+1 < steps {
				r = must(tr.Next(Step, ""))(t)
			} else {
				r = must(tr.End(Step, ""))(t)
			}
			if r.Index != uint64(e*steps+s) {
				t.Fatalf("step %d of epoch %d: %+v", s, e, r)
			}
			if spiked && r.Deltas[0].Peak+2*MiB < r.Deltas[0].UsedStart+spikeBytes {
				t.Fatalf("the spike is not in its step's record: %+v", r.Deltas[0])
			}
		}
		must(tr.End(Epoch, ""))(t)
		ok(t, tr.Begin(Stream, ""))
		time.Sleep(40 * time.Millisecond)
		must(tr.End(Stream, ""))(t)
	}
	ok(t, tr.Begin(Custom, "checkpoint"))
	time.Sleep(20 * time.Millisecond)
	must(tr.End(Custom, "checkpoint"))(t)
	fmt.Println("trained")
}

// memprobeCLI finds the memprobe command: $MEMPROBE_CLI, else the one in
// the prefix pkg-config finds (bin/memprobe, as `make install` lays it
// out), else the newest build in the repository's target/ directory.
func memprobeCLI(t *testing.T) string {
	if c := os.Getenv("MEMPROBE_CLI"); c != "" {
		return c
	}
	if out, err := exec.Command("pkg-config", "--variable=prefix", "memprobe").Output(); err == nil {
		c := filepath.Join(strings.TrimSpace(string(out)), "bin", "memprobe")
		if _, err := os.Stat(c); err == nil {
			return c
		}
	}
	best, bestTime := "", time.Time{}
	for _, profile := range []string{"release", "debug"} {
		c := filepath.Join("..", "..", "target", profile, "memprobe")
		if st, err := os.Stat(c); err == nil && st.ModTime().After(bestTime) {
			best, bestTime = c, st.ModTime()
		}
	}
	if best == "" {
		t.Fatal("no memprobe command: make install (pkg-config finds its prefix), cargo build -p memprobe-cli, or set MEMPROBE_CLI")
	}
	abs, err := filepath.Abs(best)
	ok(t, err)
	return abs
}

// TestRunPhases runs the training loop under `memprobe run`: its epochs,
// evaluation streams and the step of its spike reach the summary, the JSON
// and the chart through the run channel.
func TestRunPhases(t *testing.T) {
	if os.Getenv(runPhasesChild) != "" {
		return
	}
	cli := memprobeCLI(t)
	dir := t.TempDir()
	jsonPath, svgPath := filepath.Join(dir, "run.json"), filepath.Join(dir, "run.svg")
	cmd := exec.Command(cli, "run", "--no-live", "--interval", "5ms", "--json", jsonPath, "--plot", svgPath,
		"--", os.Args[0], "-test.run", "^TestRunPhasesChild$", "-test.count=1")
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "MEMPROBE_RUN_CHANNEL=") {
			env = append(env, kv)
		}
	}
	cmd.Env = append(env, runPhasesChild+"=1")
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("memprobe run: %v\n%s%s", err, stdout.String(), stderr.String())
	}
	if !strings.Contains(stdout.String(), "trained") {
		t.Fatalf("the child did not train:\n%s%s", stdout.String(), stderr.String())
	}

	var doc struct {
		Pid    uint64 `json:"pid"`
		Phases []struct {
			Label   string `json:"label"`
			Sources []struct {
				Fidelity  string `json:"fidelity"`
				PeakBytes uint64 `json:"peak_bytes"`
			} `json:"sources"`
			Steps struct {
				Count uint64 `json:"count"`
				Peaks []struct {
					Index uint64 `json:"index"`
				} `json:"peaks"`
			} `json:"steps"`
		} `json:"phases"`
		Channel struct {
			Dropped   uint64   `json:"dropped"`
			Steps     uint64   `json:"steps"`
			Processes []uint64 `json:"processes"`
			Peaks     []struct {
				Source      string `json:"source"`
				Label       string `json:"label"`
				StepInPhase uint64 `json:"step_in_phase"`
				PeakBytes   uint64 `json:"peak_bytes"`
			} `json:"peaks"`
		} `json:"phase_channel"`
	}
	raw, err := os.ReadFile(jsonPath)
	ok(t, err)
	ok(t, json.Unmarshal(raw, &doc))
	c := doc.Channel
	if c.Dropped != 0 || c.Steps != epochs*steps || len(c.Processes) != 1 || c.Processes[0] != doc.Pid {
		t.Fatalf("phase channel: %+v", c)
	}
	var labels []string
	for _, p := range doc.Phases {
		labels = append(labels, p.Label)
	}
	want := "epoch 0,stream 0,epoch 1,stream 1,epoch 2,stream 2,checkpoint 0"
	if strings.Join(labels, ",") != want {
		t.Fatalf("phases %v, want %s", labels, want)
	}
	e1 := doc.Phases[2]
	if e1.Steps.Count != steps || len(e1.Steps.Peaks) != 1 || e1.Steps.Peaks[0].Index != spikeEpoch*steps+spikeStep {
		t.Fatalf("epoch 1's steps: %+v", e1.Steps)
	}
	if e1.Sources[0].Fidelity != "exact" || e1.Sources[0].PeakBytes < spikeBytes || doc.Phases[0].Sources[0].PeakBytes >= 200*MiB {
		t.Fatalf("epoch records: %+v / %+v", e1.Sources, doc.Phases[0].Sources)
	}
	if len(c.Peaks) != 1 || c.Peaks[0].Label != "epoch 1 / step 13" || c.Peaks[0].StepInPhase != spikeStep || c.Peaks[0].PeakBytes < spikeBytes {
		t.Fatalf("peaks: %+v", c.Peaks)
	}
	summary := stderr.String()
	for _, needle := range []string{"3 streams, 3 epochs, 1 custom phase, 24 steps", "in epoch 1, step 13 (#5 of its epoch), exact"} {
		if !strings.Contains(summary, needle) {
			t.Fatalf("no %q in the summary:\n%s", needle, summary)
		}
	}
	svg, err := os.ReadFile(svgPath)
	ok(t, err)
	for _, needle := range []string{"epochs (shaded)", "evaluations (shaded): stream", "rss peak ", "in epoch 1, step 13"} {
		if !strings.Contains(string(svg), needle) {
			t.Fatalf("no %q in the chart", needle)
		}
	}
}
