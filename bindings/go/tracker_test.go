package memprobe

import (
	"bufio"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func pushedAt(t *testing.T, name string, v uint64) *Source {
	t.Helper()
	s := must(NewPushed(name))(t)
	ok(t, s.Push(v))
	t.Cleanup(func() { s.Close() })
	return s
}

func TestTrackerPhases(t *testing.T) {
	checkLeaks(t)
	a := pushedAt(t, "alloc", 100*MiB)
	tr := must(NewTracker(a))(t)
	defer tr.Close()
	ok(t, tr.Begin(Epoch, ""))
	var steps []PhaseRecord
	for i := uint64(0); i < 3; i++ {
		ok(t, tr.Begin(Step, ""))
		ok(t, a.Push((200+100*i)*MiB))
		ok(t, a.Push(100*MiB))
		steps = append(steps, must(tr.End(Step, ""))(t))
	}
	for i, r := range steps {
		if r.Kind != Step || r.Name != "step" || r.Depth != 1 || r.Index != uint64(i) || r.Deltas[0].Peak != (200+100*uint64(i))*MiB {
			t.Fatalf("%d: %+v", i, r)
		}
	}
	ok(t, tr.Begin(Custom, "eval"))
	ok(t, a.Push(130*MiB))
	ev := must(tr.End(Custom, "eval"))(t)
	if ev.Kind != Custom || ev.Name != "eval" {
		t.Fatalf("%+v", ev)
	}
	ok(t, tr.Begin(Step, ""))
	first := must(tr.Next(Step, ""))(t)
	second := must(tr.End(Step, ""))(t)
	if second.Index != first.Index+1 || second.Deltas[0].UsedStart != first.Deltas[0].UsedEnd {
		t.Fatalf("%+v %+v", first, second)
	}
	epoch := must(tr.End(Epoch, ""))(t)
	if epoch.Deltas[0].Peak != 400*MiB || epoch.Duration != epoch.EndedAt-epoch.StartedAt || epoch.Leaking(0) {
		t.Fatalf("%+v", epoch)
	}
	if _, err := tr.End(Epoch, ""); !errors.Is(err, ErrWrongOrder) {
		t.Fatal(err)
	}
	ok(t, tr.Begin(Step, ""))
	if err := tr.Begin(Epoch, ""); !errors.Is(err, ErrWrongOrder) {
		t.Fatal(err)
	}
	if err := tr.Begin(Custom, ""); !errors.Is(err, ErrInvalidArgument) {
		t.Fatal(err)
	}
	if err := tr.Begin(PhaseKind(42), ""); !errors.Is(err, ErrInvalidArgument) {
		t.Fatal(err)
	}
}

func TestTrackerSinks(t *testing.T) {
	checkLeaks(t)
	dir := t.TempDir()
	a := pushedAt(t, "alloc", 100*MiB)
	tr := must(NewTracker(a))(t)
	jsonl, csv := filepath.Join(dir, "p.jsonl"), filepath.Join(dir, "p.csv")
	ok(t, tr.AddJSONLSink(jsonl))
	ok(t, tr.AddCSVSink(csv))
	table, err := os.Create(filepath.Join(dir, "table.txt"))
	ok(t, err)
	defer table.Close()
	ok(t, tr.AddTableSink(Epoch, int(table.Fd())))
	var seen []PhaseRecord
	ok(t, tr.AddCallbackSink(func(r PhaseRecord) { seen = append(seen, r) }))
	for e := 0; e < 2; e++ {
		ok(t, tr.Begin(Epoch, ""))
		ok(t, tr.Begin(Step, ""))
		ok(t, a.Push(300*MiB))
		ok(t, a.Push(100*MiB))
		must(tr.End(Step, ""))(t)
		must(tr.End(Epoch, ""))(t)
	}
	if _, err := os.Stat(jsonl); err == nil {
		t.Fatal("the JSON Lines file must appear only when the sinks finish")
	}
	ok(t, tr.Close())
	ok(t, tr.Close())
	if err := tr.Begin(Epoch, ""); !errors.Is(err, ErrInvalidHandle) {
		t.Fatal(err)
	}
	if len(seen) != 4 || seen[0].Kind != Step || seen[1].Kind != Epoch || seen[0].Deltas[0].Peak != 300*MiB {
		t.Fatalf("%+v", seen)
	}
	f, err := os.Open(jsonl)
	ok(t, err)
	defer f.Close()
	n := 0
	for sc := bufio.NewScanner(f); sc.Scan(); n++ {
		if !strings.HasPrefix(sc.Text(), "{") {
			t.Fatal(sc.Text())
		}
	}
	if n != 4 {
		t.Fatal(n)
	}
	if b, err := os.ReadFile(csv); err != nil || strings.Count(string(b), "\n") < 5 {
		t.Fatal(string(b), err)
	}
	if b, err := os.ReadFile(table.Name()); err != nil || strings.Count(string(b), "\n") < 3 {
		t.Fatal(string(b), err)
	}
	if err := (&Tracker{}).AddJSONLSink(""); err == nil {
		t.Fatal("a zero tracker must fail")
	}
}

func TestTrackerReleases(t *testing.T) {
	checkLeaks(t)
	a := pushedAt(t, "alloc", 100*MiB)
	tr := must(NewTracker(a))(t)
	defer tr.Close()
	var calls []string
	ok(t, tr.AddRelease("cache", ReleaseCache, func() error {
		calls = append(calls, "cache")
		return a.Push(50 * MiB)
	}))
	ok(t, tr.AddGoGC())
	ok(t, tr.ReleaseEvery(Step, 2, false))
	ok(t, tr.Begin(Epoch, ""))
	var last PhaseRecord
	for i := 0; i < 4; i++ {
		ok(t, tr.Begin(Step, ""))
		ok(t, a.Push(100*MiB))
		last = must(tr.End(Step, ""))(t)
	}
	must(tr.End(Epoch, ""))(t)
	if len(calls) != 2 || last.Releases != 1 || last.ReleasedBytes != 50*MiB {
		t.Fatalf("%v %+v", calls, last)
	}
	if n := must(tr.ReleasesFired())(t); n != 2 {
		t.Fatal(n)
	}
	freed := must(tr.ReleaseNow(true))(t)
	if len(freed) != 1 || freed[0] != 0 {
		t.Fatal(freed)
	}
	boom := errors.New("cannot release")
	ok(t, tr.AddRelease("broken", ReleaseCache, func() error { return boom }))
	if _, err := tr.ReleaseNow(false); !errors.Is(err, ErrUnavailable) {
		t.Fatal(err)
	}
	if errs := tr.Errors(); len(errs) != 1 || !errors.Is(errs[0], boom) {
		t.Fatal(errs)
	}
	ok(t, tr.ReleaseBelowFree(0, 1, false))
	if err := tr.ReleaseBelowFree(5, 1, false); !errors.Is(err, ErrInvalidID) {
		t.Fatal(err)
	}
}

func TestTrackerLeaksAndOOM(t *testing.T) {
	checkLeaks(t)
	a := pushedAt(t, "alloc", 100*MiB)
	tr := must(NewTracker(a))(t)
	defer tr.Close()
	ok(t, tr.SetLeakPolicy(10*MiB, 2))
	var rec PhaseRecord
	for e := uint64(1); e <= 4; e++ {
		ok(t, tr.Begin(Epoch, ""))
		ok(t, a.Push((100+50*e)*MiB))
		rec = must(tr.End(Epoch, ""))(t)
	}
	st := must(tr.LeakStatus(0))(t)
	if !st.Flagged || st.Streak < 2 || st.LastGrowth != 50*MiB || !rec.Leaking(0) {
		t.Fatalf("%+v %+v", st, rec)
	}
	if _, err := tr.LeakStatus(3); !errors.Is(err, ErrInvalidID) {
		t.Fatal(err)
	}

	ok(t, tr.AddRelease("cache", ReleaseCache, func() error { return a.Push(10 * MiB) }))
	ok(t, a.Push(100*MiB))
	attempts := 0
	rep, err := tr.RunOOMRetry(func() (bool, error) {
		attempts++
		return attempts < 3, nil
	}, 5)
	ok(t, err)
	if !rep.Succeeded || rep.Retries != 2 || rep.FreedBytes != 90*MiB || rep.Freed[0] != 90*MiB {
		t.Fatalf("%+v", rep)
	}
	rep, err = tr.RunOOMRetry(func() (bool, error) { return true, nil }, 1)
	if !errors.Is(err, ErrOutOfMemory) {
		t.Fatal(err)
	}
	if rep.Succeeded || rep.Retries != 1 {
		t.Fatalf("%+v", rep)
	}
	bad := errors.New("bad batch")
	if _, err := tr.RunOOMRetry(func() (bool, error) { return false, bad }, 3); err != bad {
		t.Fatal(err)
	}
	if _, err := tr.RunOOMRetry(func() (bool, error) { panic("step panic") }, 3); err == nil || !strings.Contains(err.Error(), "step panic") {
		t.Fatal(err)
	}
	var inner error
	_, _ = tr.RunOOMRetry(func() (bool, error) {
		inner = tr.Begin(Epoch, "")
		return false, nil
	}, 0)
	if !errors.Is(inner, ErrWrongOrder) {
		t.Fatal(inner)
	}
	// OOMReport, the old name (deprecated until 0.3.0), is the same type.
	var old OOMReport = rep
	var renamed OOMRetryResult = old
	if renamed.Retries != rep.Retries || renamed.Succeeded != rep.Succeeded {
		t.Fatalf("%+v", renamed)
	}
}

func TestTrackerExactStepPeak(t *testing.T) {
	checkLeaks(t)
	rss := must(NewProcess())(t)
	defer rss.Close()
	tr := must(NewTracker(rss))(t)
	defer tr.Close()
	ok(t, tr.Begin(Epoch, ""))
	ok(t, tr.Begin(Step, ""))
	spike(t, 96*MiB)
	d := must(tr.End(Step, ""))(t).Deltas[0]
	if d.Peak+slack < d.UsedStart+96*MiB || d.Fidelity != Exact {
		t.Fatalf("%+v", d)
	}
}

func TestTrackerTails(t *testing.T) {
	checkLeaks(t)
	a := pushedAt(t, "alloc", 100*MiB)
	tr := must(NewTracker(a))(t)
	defer tr.Close()
	ok(t, tr.Begin(Epoch, ""))
	ok(t, tr.Begin(Step, ""))
	first := must(tr.EndInto(Step, "", Step, ""))(t)
	ok(t, a.Push(300*MiB)) // between the steps: the next one's
	ok(t, a.Push(120*MiB))
	ok(t, tr.Resume(Step, "", Step, ""))
	second := must(tr.EndInto(Step, "", Step, ""))(t)
	if second.Index != 1 || second.StartedAt != first.EndedAt || second.Deltas[0].Peak != 300*MiB {
		t.Fatalf("%+v %+v", first, second)
	}
	ok(t, tr.Resume(Custom, "eval", Step, ""))
	ev := must(tr.EndInto(Custom, "eval", Step, ""))(t)
	if ev.Name != "eval" || ev.StartedAt != second.EndedAt {
		t.Fatalf("%+v", ev)
	}
	ok(t, tr.MarkTail(Step, ""))
	third := must(tr.EndTail(Step, "", Step, ""))(t)
	if third.Index != 2 || third.StartedAt < ev.EndedAt {
		t.Fatalf("%+v", third)
	}
	if err := tr.Resume(Epoch, "", Step, ""); !errors.Is(err, ErrWrongOrder) {
		t.Fatal(err)
	}
	if _, err := tr.EndInto(Step, "", Step, ""); !errors.Is(err, ErrWrongOrder) {
		t.Fatal(err)
	}
	if err := tr.MarkTail(Custom, ""); !errors.Is(err, ErrInvalidArgument) {
		t.Fatal(err)
	}
	must(tr.End(Epoch, ""))(t)
}
