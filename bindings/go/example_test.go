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
