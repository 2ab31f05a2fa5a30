package memprobe

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const slack = 2 * MiB // the kernel counts RSS in per-CPU batches

// spike maps, touches and unmaps n bytes: a short RSS spike that Go's heap
// cannot absorb.
func spike(t testing.TB, n int) {
	t.Helper()
	b, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i += 4096 {
		b[i] = 1
	}
	if err := syscall.Munmap(b); err != nil {
		t.Fatal(err)
	}
}

// must(f())(t) is f's value, or a fatal error.
func must[T any](v T, err error) func(testing.TB) T {
	return func(t testing.TB) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

func ok(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// checkLeaks fails the test if it leaves library handles or registered
// callbacks behind.
func checkLeaks(t *testing.T) {
	h0, err := LiveHandles()
	ok(t, err)
	c0 := callbacks.len()
	t.Cleanup(func() {
		h1, err := LiveHandles()
		ok(t, err)
		if h1 != h0 {
			t.Errorf("live handles %+v -> %+v", h0, h1)
		}
		if c := callbacks.len(); c != c0 {
			t.Errorf("registered callbacks %d -> %d", c0, c)
		}
	})
}

func TestVersion(t *testing.T) {
	want := fmt.Sprintf("%d.%d.%d", ABIMajor, ABIMinor, ABIPatch)
	if Version() != want {
		t.Fatalf("library %s, header %s", Version(), want)
	}
	so := fmt.Sprintf("libmemprobe.so.%d.%d", ABIMajor, ABIMinor)
	if ABIMajor > 0 {
		so = fmt.Sprintf("libmemprobe.so.%d", ABIMajor)
	}
	if Soname() != so {
		t.Fatalf("soname %s, want %s", Soname(), so)
	}
	if B2MBSigned(-MiB+1) != 0 || B2MBSigned(-MiB-1) != -1 || B2MBSigned(math.MinInt64) != -(1<<43) {
		t.Fatal("B2MBSigned")
	}
	if B2MB(3*MiB-1) != 2 || B2MB(0) != 0 {
		t.Fatal("B2MB")
	}
}

func TestStatusNamesAndSentinels(t *testing.T) {
	if StatusOK.String() != "ok" || StatusWrongOrder.String() != "wrong call order" {
		t.Fatalf("%q %q", StatusOK, StatusWrongOrder)
	}
	if StatusOutOfMemory.String() != "out of memory" {
		t.Fatal(StatusOutOfMemory.String())
	}
	if Status(9999).String() != "unknown status" {
		t.Fatal(Status(9999).String())
	}
	sentinels := []*Error{ErrNullPointer, ErrInvalidArgument, ErrInvalidHandle, ErrInvalidID, ErrWrongOrder,
		ErrUnavailable, ErrUnsupported, ErrPermissionDenied, ErrIO, ErrParse, ErrGPULost, ErrBufferTooSmall,
		ErrPanic, ErrInternal, ErrOutOfMemory}
	for i, s := range sentinels {
		if s.Status != Status(i+1) {
			t.Fatalf("sentinel %d has status %d", i, s.Status)
		}
		err := error(&Error{Status: s.Status, Message: "why"})
		if !errors.Is(err, s) {
			t.Fatalf("errors.Is(%v, %v)", err, s)
		}
		for _, other := range sentinels {
			if other != s && errors.Is(err, other) {
				t.Fatalf("%v matches %v", err, other)
			}
		}
	}
}

func TestProcessRead(t *testing.T) {
	checkLeaks(t)
	rss := must(NewProcess())(t)
	defer rss.Close()
	s := must(rss.Read())(t)
	if s.Used == 0 || s.HasTotal || s.HasFree || s.HasLimit || s.HasReserved || s.TakenAt == 0 {
		t.Fatalf("%+v", s)
	}
	info := must(rss.Info())(t)
	if info.Kind != KindProcess || info.Fidelity != Exact || info.Name == "" {
		t.Fatalf("%+v", info)
	}
	if rss.String() != info.Name || info.Kind.String() != "process" || info.Fidelity.String() != "exact" {
		t.Fatal(rss.String(), info.Kind, info.Fidelity)
	}
	used := must(rss.Used())(t)
	if diff := int64(used) - int64(s.Used); diff > 64*MiB || diff < -64*MiB {
		t.Fatalf("used %d vs %d", used, s.Used)
	}
}

func TestOtherSources(t *testing.T) {
	checkLeaks(t)
	preserve := must(NewProcessPreservingHWM())(t)
	defer preserve.Close()
	if must(preserve.Info())(t).Fidelity != Sampled {
		t.Fatal("preserving VmHWM must be sampled")
	}
	tree := must(NewProcessTree())(t)
	defer tree.Close()
	if must(tree.Info())(t).Kind != KindProcessTree || must(tree.Read())(t).Used == 0 {
		t.Fatal("tree")
	}
	ram := must(NewSystemRAM())(t)
	defer ram.Close()
	s := must(ram.Read())(t)
	if !s.HasTotal || !s.HasFree || s.Used > s.Total {
		t.Fatalf("%+v", s)
	}
	if cg, err := NewCgroup(); err == nil {
		defer cg.Close()
		if must(cg.Read())(t).Used == 0 {
			t.Fatal("cgroup used 0")
		}
	} else if !errors.Is(err, ErrUnavailable) {
		t.Fatal(err)
	}
	for _, m := range []SmapsMetric{PSS, USS} {
		src, err := NewSmaps(m)
		if errors.Is(err, ErrUnavailable) {
			t.Skip("no smaps_rollup")
		}
		ok(t, err)
		if must(src.Read())(t).Used == 0 {
			t.Fatal("smaps used 0")
		}
		src.Close()
	}
	if _, err := NewSmaps(7); !errors.Is(err, ErrInvalidArgument) {
		t.Fatal(err)
	}
	for m, kind := range map[SmapsMetric]SourceKind{PSS: KindProcessTreePSS, USS: KindProcessTreeUSS} {
		src := must(NewProcessTreeSmaps(m))(t)
		if info := must(src.Info())(t); info.Kind != kind || info.Fidelity != Sampled {
			t.Fatalf("tree smaps info %+v", info)
		}
		if must(src.Read())(t).Used == 0 {
			t.Fatal("tree smaps used 0")
		}
		src.Close()
	}
	if _, err := NewProcessTreeSmaps(7); !errors.Is(err, ErrInvalidArgument) {
		t.Fatal(err)
	}
}

func TestPushed(t *testing.T) {
	checkLeaks(t)
	p := must(NewPushed("allocator"))(t)
	defer p.Close()
	ok(t, p.Push(123*MiB))
	if must(p.Read())(t).Used != 123*MiB || must(p.Used())(t) != 123*MiB {
		t.Fatal("pushed value")
	}
	info := must(p.Info())(t)
	if info.Name != "allocator" || info.Kind != KindCustom || info.Fidelity != Pushed {
		t.Fatalf("%+v", info)
	}
	rss := must(NewProcess())(t)
	defer rss.Close()
	err := rss.Push(1)
	var e *Error
	if !errors.Is(err, ErrUnsupported) || !errors.As(err, &e) || !strings.Contains(e.Message, "memprobe_source_push") {
		t.Fatal(err)
	}
	for _, name := range []string{"", strings.Repeat("x", 65), "bad\nname"} {
		if _, err := NewPushed(name); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("%q: %v", name, err)
		}
	}
}

func TestClosedSourceIsAnInvalidHandle(t *testing.T) {
	checkLeaks(t)
	p := must(NewPushed("gone"))(t)
	ok(t, p.Close())
	ok(t, p.Close())
	if _, err := p.Read(); !errors.Is(err, ErrInvalidHandle) {
		t.Fatal(err)
	}
	if _, err := p.Used(); !errors.Is(err, ErrInvalidHandle) {
		t.Fatal(err)
	}
	if _, err := OpenWindow(p); !errors.Is(err, ErrInvalidHandle) {
		t.Fatal(err)
	}
	if p.String() != "<closed>" {
		t.Fatal(p.String())
	}
	if _, err := OpenWindow(); !errors.Is(err, ErrInvalidArgument) {
		t.Fatal(err)
	}
	if _, err := OpenWindow(nil); !errors.Is(err, ErrNullPointer) {
		t.Fatal(err)
	}
}

func TestCallbackSource(t *testing.T) {
	checkLeaks(t)
	var mu sync.Mutex
	value := uint64(5 * MiB)
	src := must(NewCallback("pool", func() (uint64, error) {
		mu.Lock()
		defer mu.Unlock()
		return value, nil
	}))(t)
	defer src.Close()
	if must(src.Read())(t).Used != 5*MiB {
		t.Fatal("callback value")
	}
	info := must(src.Info())(t)
	if info.Kind != KindCustom || info.Fidelity != Sampled {
		t.Fatalf("%+v", info)
	}
	mu.Lock()
	value = 7 * MiB
	mu.Unlock()
	if must(src.Read())(t).Used != 7*MiB {
		t.Fatal("callback value 2")
	}
}

func TestCallbackErrorsAndPanicsBecomeTheCause(t *testing.T) {
	checkLeaks(t)
	gone := errors.New("allocator gone")
	bad := must(NewCallback("bad", func() (uint64, error) { return 0, gone }))(t)
	defer bad.Close()
	_, err := bad.Read()
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, gone) {
		t.Fatal(err)
	}
	boom := must(NewCallback("boom", func() (uint64, error) { panic("boom") }))(t)
	defer boom.Close()
	_, err = boom.Read()
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "panicked: boom") {
		t.Fatal(err)
	}
	if _, err := NewCallback("nil", nil); !errors.Is(err, ErrNullPointer) {
		t.Fatal(err)
	}
}

func TestCallbackSourceStaysRegisteredWhileAWindowIsOpen(t *testing.T) {
	checkLeaks(t)
	ok(t, SetMonitorInterval(time.Millisecond))
	defer SetMonitorInterval(10 * time.Millisecond)
	var mu sync.Mutex
	value := uint64(MiB)
	src := must(NewCallback("poll", func() (uint64, error) {
		mu.Lock()
		defer mu.Unlock()
		return value, nil
	}))(t)
	w := must(OpenWindow(src))(t)
	ok(t, src.Close()) // the window keeps it (and its read function)
	mu.Lock()
	value = 50 * MiB
	mu.Unlock()
	before := must(GetMonitorStats())(t).Reads
	deadline := time.Now().Add(5 * time.Second)
	for must(GetMonitorStats())(t).Reads < before+2 && time.Now().Before(deadline) {
		time.Sleep(2 * time.Millisecond)
	}
	mu.Lock()
	value = 2 * MiB
	mu.Unlock()
	if p := must(w.Peak(0))(t); p != 50*MiB {
		t.Fatalf("peak %d: the monitor did not poll the callback", p)
	}
	if d := must(w.Measure(0))(t); d.Fidelity != Sampled {
		t.Fatal(d.Fidelity)
	}
	ok(t, w.Close())
}

func TestWindowSeesAnExactSpike(t *testing.T) {
	checkLeaks(t)
	rss := must(NewProcess())(t)
	defer rss.Close()
	w := must(OpenWindow(rss))(t)
	defer w.Close()
	start := must(w.Measure(0))(t).UsedStart
	spike(t, 128*MiB)
	d := must(w.Measure(0))(t)
	if d.Peak+slack < start+128*MiB || d.Fidelity != Exact {
		t.Fatalf("peak %d from %d misses the spike (%+v)", d.Peak, start, d)
	}
	if must(w.Peak(0))(t)+slack < d.Peak {
		t.Fatal("Peak below Measure's peak")
	}
}

func TestWindowsAreIndependent(t *testing.T) {
	checkLeaks(t)
	rss := must(NewProcess())(t)
	defer rss.Close()
	outer := must(OpenWindow(rss))(t)
	inner := must(OpenWindow(rss))(t)
	spike(t, 96*MiB)
	must(inner.Reset())(t)
	op, ip := must(outer.Peak(0))(t), must(inner.Peak(0))(t)
	if ip+64*MiB > op {
		t.Fatalf("inner %d outer %d", ip, op)
	}
	ok(t, inner.Close())
	if must(outer.Peak(0))(t)+slack < op {
		t.Fatal("closing the inner window changed the outer's peak")
	}
	ok(t, outer.Close())
	ok(t, outer.Close())
	if _, err := outer.Peak(0); !errors.Is(err, ErrInvalidHandle) {
		t.Fatal(err)
	}
}

func TestWindowResetAndDeltaRule(t *testing.T) {
	checkLeaks(t)
	a := must(NewPushed("a"))(t)
	defer a.Close()
	b := must(NewPushed("b"))(t)
	defer b.Close()
	ok(t, a.Push(100))
	ok(t, b.Push(7))
	w := must(OpenWindow(a, b))(t)
	defer w.Close()
	if w.Len() != 2 || must(w.SourceCount())(t) != 2 || len(w.Sources()) != 2 {
		t.Fatal("source count")
	}
	ok(t, a.Push(1000))
	ok(t, a.Push(300))
	ended := must(w.Reset())(t)
	d := ended[0]
	if d.UsedStart != 100 || d.UsedEnd != 300 || d.Peak != 1000 || d.DeltaUsed != 200 || d.DeltaPeaked != 700 || d.Fidelity != Pushed {
		t.Fatalf("%+v", d)
	}
	if ended[1].Peak != 7 || ended[1].DeltaUsed != 0 {
		t.Fatalf("%+v", ended[1])
	}
	if peaks := must(w.Peaks())(t); peaks[0] != 300 || peaks[1] != 7 {
		t.Fatal(peaks)
	}
	ok(t, a.Push(50))
	if d := must(w.Measure(0))(t); d.DeltaUsed != -250 || d.DeltaPeaked != 0 {
		t.Fatalf("%+v", d)
	}
	if _, err := w.Peak(2); !errors.Is(err, ErrInvalidID) {
		t.Fatal(err)
	}
}

var line = regexp.MustCompile(`^△Used Peaked MB: +(-?[\d,]+) +([\d,]+)(?: \((.*)\))?$`)

func lines(t *testing.T, s string) []string {
	t.Helper()
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(s), "\n") {
		if l == "" {
			continue
		}
		if !line.MatchString(l) {
			t.Fatalf("not a report line: %q", l)
		}
		out = append(out, l)
	}
	return out
}

func TestTraceReports(t *testing.T) {
	checkLeaks(t)
	p := must(NewPushed("p"))(t)
	defer p.Close()
	ok(t, p.Push(10*MiB))
	var buf bytes.Buffer
	tr := must(NewTrace(TraceOptions{Ctx: "foobar", Output: &buf}, p))(t)
	defer tr.Close()
	ok(t, p.Push(110*MiB))
	ok(t, p.Push(30*MiB+5))
	u, pk, err := tr.Data(0)
	ok(t, err)
	if u != 20*MiB+5 || pk != 80*MiB-5 {
		t.Fatal(u, pk)
	}
	um, pm, err := tr.DataMB(0)
	ok(t, err)
	if um != 20 || pm != 79 {
		t.Fatal(um, pm)
	}
	if d := must(tr.Measure(0))(t); d.Peak != 110*MiB {
		t.Fatalf("%+v", d)
	}
	ok(t, tr.Report(""))
	ok(t, tr.Report("1st try"))
	ls := lines(t, buf.String())
	if len(ls) != 2 || !strings.HasSuffix(ls[0], "(foobar)") || !strings.HasSuffix(ls[1], "(foobar: 1st try)") {
		t.Fatal(ls)
	}
	if m := line.FindStringSubmatch(ls[0]); m[1] != "20" || m[2] != "79" {
		t.Fatal(m)
	}
	long := strings.Repeat("n", 1000)
	if f := must(tr.Format(long))(t); !strings.HasSuffix(f, "(foobar: "+long+")") {
		t.Fatal(f)
	}
	if !line.MatchString(tr.String()) {
		t.Fatal(tr.String())
	}
}

func TestTraceOrderAndSilence(t *testing.T) {
	checkLeaks(t)
	p := must(NewPushed("p"))(t)
	defer p.Close()
	var buf bytes.Buffer
	tr := must(NewTrace(TraceOptions{Silent: true, Output: &buf}, p))(t)
	if err := tr.Start(); !errors.Is(err, ErrWrongOrder) {
		t.Fatal(err)
	}
	ok(t, tr.Report("silent"))
	ok(t, tr.SetSilent(false))
	ok(t, tr.ReportNReset("loud"))
	ok(t, tr.Stop())
	if err := tr.Stop(); !errors.Is(err, ErrWrongOrder) {
		t.Fatal(err)
	}
	if err := tr.Reset(); !errors.Is(err, ErrWrongOrder) {
		t.Fatal(err)
	}
	if running := must(tr.Running())(t); running {
		t.Fatal("running after stop")
	}
	ok(t, p.Push(5))
	if u, _, _ := tr.Data(0); u != 0 {
		t.Fatal("a stopped trace must be frozen", u)
	}
	ok(t, tr.Close())
	ok(t, tr.Close())
	if _, _, err := tr.Data(0); !errors.Is(err, ErrInvalidHandle) {
		t.Fatal(err)
	}
	if tr.String() != "<closed trace>" {
		t.Fatal(tr.String())
	}
	if ls := lines(t, buf.String()); len(ls) != 1 || !strings.HasSuffix(ls[0], "(loud)") {
		t.Fatal(ls)
	}
	d := must(NewTrace(TraceOptions{Deferred: true, Silent: true}, p))(t)
	if running := must(d.Running())(t); running {
		t.Fatal("deferred trace running")
	}
	ok(t, d.Close())
}

func TestTraceEndAndRun(t *testing.T) {
	checkLeaks(t)
	p := must(NewPushed("p"))(t)
	defer p.Close()
	var buf bytes.Buffer
	err := Run(TraceOptions{Ctx: "train", Output: &buf}, func() error {
		return p.Push(3 * MiB)
	}, p)
	ok(t, err)
	boom := errors.New("boom")
	err = Run(TraceOptions{Ctx: "fails", Output: &buf, Deferred: true}, func() error { return boom }, p)
	if err != boom {
		t.Fatal(err)
	}
	func() {
		tr := must(NewTrace(TraceOptions{Ctx: "scope", Output: &buf}, p))(t)
		defer tr.End()
	}()
	ls := lines(t, buf.String())
	if len(ls) != 3 || !strings.HasSuffix(ls[0], "(train: exit)") || !strings.HasSuffix(ls[1], "(fails: exit)") ||
		!strings.HasSuffix(ls[2], "(scope: exit)") {
		t.Fatal(ls)
	}
	if m := line.FindStringSubmatch(ls[0]); m[1] != "3" {
		t.Fatal(m)
	}
}

func TestTraceOutputFD(t *testing.T) {
	checkLeaks(t)
	f, err := os.CreateTemp(t.TempDir(), "report")
	ok(t, err)
	defer f.Close()
	rss := must(NewProcess())(t)
	defer rss.Close()
	tr := must(NewTrace(TraceOptions{Ctx: "fd"}, rss))(t)
	defer tr.Close()
	ok(t, tr.SetOutput(&bytes.Buffer{}))
	ok(t, tr.SetOutputFD(int(f.Fd())))
	ok(t, tr.Report("n"))
	b, err := os.ReadFile(f.Name())
	ok(t, err)
	if ls := lines(t, string(b)); len(ls) != 1 || !strings.HasSuffix(ls[0], "(fd: n)") {
		t.Fatal(ls)
	}
}

func TestTraceSeesExactSpike(t *testing.T) {
	checkLeaks(t)
	rss := must(NewProcess())(t)
	defer rss.Close()
	tr := must(NewTrace(TraceOptions{Silent: true}, rss))(t)
	defer tr.Close()
	spike(t, 100*MiB)
	if _, peaked, _ := tr.Data(0); peaked+slack < 100*MiB {
		t.Fatal(peaked)
	}
}

func TestMonitor(t *testing.T) {
	checkLeaks(t)
	defer SetMonitorInterval(10 * time.Millisecond)
	ok(t, SetMonitorInterval(2*time.Millisecond))
	if s := must(GetMonitorStats())(t); s.Interval != 2*time.Millisecond {
		t.Fatal(s.Interval)
	}
	for _, d := range []time.Duration{0, MinMonitorInterval - 1, MaxMonitorInterval + 1, -time.Second} {
		if err := SetMonitorInterval(d); !errors.Is(err, ErrInvalidArgument) {
			t.Fatal(d, err)
		}
	}
	ok(t, StopMonitor())
	if must(GetMonitorStats())(t).Running {
		t.Fatal("running after stop")
	}
	ram := must(NewSystemRAM())(t)
	defer ram.Close()
	w := must(OpenWindow(ram))(t)
	if s := must(GetMonitorStats())(t); !s.Running || s.Watched == 0 {
		t.Fatalf("%+v", s)
	}
	ok(t, w.Close())
}

func TestConcurrentUse(t *testing.T) {
	checkLeaks(t)
	rss := must(NewProcess())(t)
	defer rss.Close()
	w := must(OpenWindow(rss))(t)
	defer w.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				if _, err := rss.Read(); err != nil {
					errs <- err
					return
				}
				if _, err := w.Peak(0); err != nil {
					errs <- err
					return
				}
				// A failure on one goroutine reports its own message.
				if _, err := w.Peak(9); !errors.Is(err, ErrInvalidID) {
					errs <- fmt.Errorf("want invalid id, got %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}
