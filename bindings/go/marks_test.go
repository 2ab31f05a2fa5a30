package memprobe

import (
	"errors"
	"sync"
	"testing"
)

// fakeAllocator stands in for a framework allocator: marks per device for
// allocated (even index) and reserved (odd) bytes, one reset for all.
type fakeAllocator struct {
	mu        sync.Mutex
	now, peak [4]uint64
	resets    int
	failPeak  error
	panicNext bool
	during    func() // called inside Current (re-entry tests)
}

func (a *fakeAllocator) set(i int, n uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.now[i] = n
	a.peak[i] = max(a.peak[i], n)
}

// spike rises by n bytes and falls back.
func (a *fakeAllocator) spike(i int, n uint64) {
	before := a.now[i]
	a.set(i, before+n)
	a.set(i, before)
}

func (a *fakeAllocator) Current(i int) (uint64, error) {
	if a.during != nil {
		a.during()
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.panicNext {
		a.panicNext = false
		panic("allocator is gone")
	}
	return a.now[i], nil
}

func (a *fakeAllocator) Peak(i int) (uint64, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.failPeak != nil {
		return 0, a.failPeak
	}
	return a.peak[i], nil
}

func (a *fakeAllocator) Reset() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.peak = a.now
	a.resets++
	return nil
}

var markNames = []string{"alloc:0", "reserved:0", "alloc:1", "reserved:1"}

func markSources(t *testing.T, a *fakeAllocator) (*MarkGroup, []*Source) {
	t.Helper()
	g := must(NewMarkGroup(a))(t)
	srcs := make([]*Source, len(markNames))
	for i, n := range markNames {
		srcs[i] = must(g.Source(i, n))(t)
	}
	t.Cleanup(func() {
		for _, s := range srcs {
			ok(t, s.Close())
		}
		ok(t, g.Close())
	})
	return g, srcs
}

func TestMarkSourceSeesTheSpikeToTheByte(t *testing.T) {
	checkLeaks(t)
	a := &fakeAllocator{}
	_, srcs := markSources(t, a)
	info := must(srcs[0].Info())(t)
	if info.Kind != KindCustom || info.Fidelity != Exact || info.Name != "alloc:0" {
		t.Fatalf("info %+v", info)
	}
	a.set(0, 100*MiB)
	w := must(OpenWindow(srcs[0]))(t)
	defer w.Close()
	a.spike(0, 2048*MiB+7)
	if p := must(w.Peak(0))(t); p != 100*MiB+2048*MiB+7 {
		t.Fatalf("peak %d", p)
	}
	d := must(w.Reset())(t)
	if d[0].Peak != 100*MiB+2048*MiB+7 || must(w.Peak(0))(t) != 100*MiB {
		t.Fatalf("reset %+v", d)
	}
}

func TestMarkSharedResetKeepsOtherPeaks(t *testing.T) {
	checkLeaks(t)
	a := &fakeAllocator{}
	_, srcs := markSources(t, a)
	all := must(OpenWindow(srcs...))(t)
	defer all.Close()
	epoch := must(OpenWindow(srcs[3]))(t)
	defer epoch.Close()
	a.spike(3, 700*MiB)
	for i := 0; i < 3; i++ {
		step := must(OpenWindow(srcs[0]))(t)
		a.spike(0, uint64(i+1)*MiB)
		if p := must(step.Peak(0))(t); p != uint64(i+1)*MiB {
			t.Fatalf("step %d peak %d", i, p)
		}
		ok(t, step.Close())
	}
	if a.resets == 0 || a.peak[3] != 0 {
		t.Fatalf("the framework's marks were not reset: %d %v", a.resets, a.peak)
	}
	if p := must(epoch.Peak(0))(t); p != 700*MiB {
		t.Fatalf("reserved:1 peak %d, want 700 MiB", p)
	}
	ps := must(all.Peaks())(t)
	if ps[0] != 3*MiB || ps[3] != 700*MiB {
		t.Fatalf("peaks %v", ps)
	}
}

func TestMarkCallbackErrorsAndReentry(t *testing.T) {
	checkLeaks(t)
	a := &fakeAllocator{}
	g, srcs := markSources(t, a)
	w := must(OpenWindow(srcs[0]))(t)
	defer w.Close()
	a.spike(0, 5*MiB)

	boom := errors.New("no allocator")
	a.failPeak = boom
	if _, err := w.Peak(0); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("failing Peak: %v", err)
	}
	a.failPeak = nil
	if p := must(w.Peak(0))(t); p != 5*MiB {
		t.Fatalf("peak after a failure %d", p)
	}
	a.panicNext = true
	_, err := srcs[1].Read()
	if !errors.Is(err, ErrUnavailable) || err.(*Error).Cause == nil {
		t.Fatalf("panicking Current: %v", err)
	}

	var inner, innerNew error
	a.during = func() {
		a.during = nil
		_, inner = srcs[1].Read()
		_, innerNew = g.Source(9, "inner")
	}
	must(srcs[0].Read())(t)
	if !errors.Is(inner, ErrWrongOrder) || !errors.Is(innerNew, ErrWrongOrder) {
		t.Fatalf("re-entry: %v / %v", inner, innerNew)
	}
}

func TestMarkGroupBadInputAndLifetime(t *testing.T) {
	checkLeaks(t)
	if _, err := NewMarkGroup(nil); !errors.Is(err, ErrNullPointer) {
		t.Fatalf("nil marks: %v", err)
	}
	a := &fakeAllocator{}
	g := must(NewMarkGroup(a))(t)
	if _, err := g.Source(-1, "x"); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("negative index: %v", err)
	}
	if _, err := g.Source(0, ""); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("empty name: %v", err)
	}
	s := must(g.Source(0, "alloc:0"))(t)
	if _, err := g.Source(0, "again"); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("duplicate index: %v", err)
	}
	// The source keeps the group (and a) alive after Close.
	ok(t, g.Close())
	ok(t, g.Close())
	if _, err := g.Source(1, "late"); !errors.Is(err, ErrInvalidHandle) {
		t.Fatalf("closed group: %v", err)
	}
	w := must(OpenWindow(s))(t)
	ok(t, s.Close())
	a.spike(0, 3*MiB)
	if p := must(w.Peak(0))(t); p != 3*MiB {
		t.Fatalf("peak %d", p)
	}
	ok(t, w.Close())
}

func TestMarkTrackerPerStepAndEpoch(t *testing.T) {
	checkLeaks(t)
	a := &fakeAllocator{}
	_, srcs := markSources(t, a)
	tr := must(NewTracker(srcs...))(t)
	defer tr.Close()
	a.set(0, 8*MiB)
	ok(t, tr.Begin(Epoch, ""))
	ok(t, tr.Begin(Step, ""))
	a.spike(0, 2048*MiB)
	r := must(tr.Next(Step, ""))(t)
	if r.Deltas[0].Peak != 2056*MiB {
		t.Fatalf("step 0 %+v", r.Deltas[0])
	}
	a.spike(1, 3*MiB)
	r = must(tr.End(Step, ""))(t)
	if r.Deltas[0].Peak != 8*MiB || r.Deltas[1].Peak != 3*MiB {
		t.Fatalf("step 1 %+v", r.Deltas)
	}
	r = must(tr.End(Epoch, ""))(t)
	if r.Kind != Epoch || r.Deltas[0].Peak != 2056*MiB || r.Deltas[1].Peak != 3*MiB || r.Deltas[0].Fidelity != Exact {
		t.Fatalf("epoch %+v", r)
	}
}

// batchedAllocator reads every mark from one snapshot (MarksMany).
type batchedAllocator struct {
	fakeAllocator
	reads int
}

func (a *batchedAllocator) ReadMany(what MarkValue, indices []int, out []uint64) error {
	a.reads++
	for i, idx := range indices {
		var err error
		switch what {
		case MarkCurrent:
			out[i], err = a.Current(idx)
		case MarkPeak:
			out[i], err = a.Peak(idx)
		default:
			return errors.New("unknown mark value")
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func TestMarksReadAtOnceGiveTheSamePeaksInTwoReads(t *testing.T) {
	checkLeaks(t)
	a := &batchedAllocator{}
	g := must(NewMarkGroup(a))(t)
	defer g.Close()
	alloc := must(g.Source(0, "alloc:0"))(t)
	defer alloc.Close()
	reserved := must(g.Source(1, "reserved:0"))(t)
	defer reserved.Close()
	a.set(0, 10*MiB)
	a.set(1, 30*MiB)
	step := must(OpenWindow(alloc, reserved))(t)
	defer step.Close()
	for i := uint64(1); i <= 10; i++ {
		a.spike(0, i*MiB)
		a.spike(1, 2*i*MiB)
		reads, resets := a.reads, a.resets
		d := must(step.Reset())(t)
		if d[0].Peak != 10*MiB+i*MiB || d[1].Peak != 30*MiB+2*i*MiB {
			t.Fatalf("round %d: %+v", i, d)
		}
		if a.reads != reads+2 || a.resets != resets+1 {
			t.Fatalf("round %d: %d reads, %d resets per boundary", i, a.reads-reads, a.resets-resets)
		}
	}
	a.failPeak = errors.New("stats are gone")
	if _, err := step.Reset(); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("failing ReadMany: %v", err)
	}
	a.failPeak = nil
}
