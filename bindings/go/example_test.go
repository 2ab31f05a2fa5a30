package memprobe_test

import (
	"errors"
	"fmt"
	"os"

	"memprobe.dev/memprobe"
)

// Reading this process's RSS.
func ExampleNewProcess() {
	rss, err := memprobe.NewProcess()
	if err != nil {
		panic(err)
	}
	defer rss.Close()
	s, err := rss.Read()
	if err != nil {
		panic(err)
	}
	info, _ := rss.Info()
	fmt.Println(info.Name, info.Kind, info.Fidelity, s.Used > 0)
	// Output: rss process exact true
}

// A step window inside an epoch window: each keeps its own peak.
func ExampleOpenWindow() {
	alloc, _ := memprobe.NewPushed("allocator") // e.g. a framework's allocated bytes
	defer alloc.Close()
	alloc.Push(100 * memprobe.MiB)
	epoch, _ := memprobe.OpenWindow(alloc)
	defer epoch.Close()
	step, _ := memprobe.OpenWindow(alloc)
	defer step.Close()
	for i := 1; i <= 3; i++ {
		alloc.Push(uint64(100+100*i) * memprobe.MiB) // activations
		alloc.Push(100 * memprobe.MiB)               // freed after backward
		ended, _ := step.Reset()
		fmt.Printf("step %d peak %d MiB\n", i, memprobe.B2MB(ended[0].Peak))
	}
	peak, _ := epoch.Peak(0)
	fmt.Printf("epoch peak %d MiB\n", memprobe.B2MB(peak))
	// Output:
	// step 1 peak 200 MiB
	// step 2 peak 300 MiB
	// step 3 peak 400 MiB
	// epoch peak 400 MiB
}

// fastai's GPUMemTrace over any source, with a scoped report.
func ExampleNewTrace() {
	alloc, _ := memprobe.NewPushed("allocator")
	defer alloc.Close()
	alloc.Push(10 * memprobe.MiB)
	tr, err := memprobe.NewTrace(memprobe.TraceOptions{Ctx: "eval", Output: os.Stdout}, alloc)
	if err != nil {
		panic(err)
	}
	defer tr.End() // prints "(eval: exit)"
	alloc.Push(500 * memprobe.MiB)
	alloc.Push(40 * memprobe.MiB)
	tr.Report("batch 1")
	used, peaked, _ := tr.Data(0)
	fmt.Println(used, peaked)
	// Output:
	// △Used Peaked MB:     30    460 (eval: batch 1)
	// 31457280 482344960
	// △Used Peaked MB:     30    460 (eval: exit)
}

// Errors carry the status; match them with errors.Is.
func ExampleError() {
	tr, _ := memprobe.NewTrace(memprobe.TraceOptions{Deferred: true}, mustProcess())
	defer tr.Close()
	err := tr.Stop()
	var e *memprobe.Error
	fmt.Println(errors.Is(err, memprobe.ErrWrongOrder), errors.As(err, &e) && e.Status == memprobe.StatusWrongOrder)
	// Output: true true
}

// A custom source: the library calls the Go function.
func ExampleNewCallback() {
	pool := uint64(64 * memprobe.MiB)
	src, _ := memprobe.NewCallback("pool", func() (uint64, error) { return pool, nil })
	defer src.Close()
	s, _ := src.Read()
	fmt.Println(memprobe.B2MB(s.Used))
	// Output: 64
}

func mustProcess() *memprobe.Source {
	s, err := memprobe.NewProcess()
	if err != nil {
		panic(err)
	}
	return s
}

// The training-loop tracker: per-step and per-epoch records, a cache
// release every 2 steps.
func ExampleTracker() {
	alloc, _ := memprobe.NewPushed("alloc")
	defer alloc.Close()
	alloc.Push(100 * memprobe.MiB)
	tr, _ := memprobe.NewTracker(alloc)
	defer tr.Close()
	tr.AddRelease("empty cache", memprobe.ReleaseCache, func() error { return alloc.Push(80 * memprobe.MiB) })
	tr.ReleaseEvery(memprobe.Step, 2, false)
	tr.Begin(memprobe.Epoch, "")
	for i := 1; i <= 2; i++ {
		tr.Begin(memprobe.Step, "")
		alloc.Push(uint64(100+50*i) * memprobe.MiB)
		r, _ := tr.End(memprobe.Step, "")
		fmt.Printf("step %d: peak %d MiB, releases %d\n", r.Index, memprobe.B2MB(r.Deltas[0].Peak), r.Releases)
	}
	e, _ := tr.End(memprobe.Epoch, "")
	fmt.Printf("epoch %d: peak %d MiB, delta used %d MiB\n", e.Index, memprobe.B2MB(e.Deltas[0].Peak), memprobe.B2MBSigned(e.Deltas[0].DeltaUsed))
	// Output:
	// step 0: peak 150 MiB, releases 0
	// step 1: peak 200 MiB, releases 1
	// epoch 0: peak 200 MiB, delta used -20 MiB
}
