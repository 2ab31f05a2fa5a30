package memprobe

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

const gib = 1 << 30

// GPU scenarios run in a child process of the test binary (the GPU backend
// is chosen once per process), against the fake NVML of tests/fake-gpu.
const scenarioEnv = "MEMPROBE_GO_GPU_SCENARIO"

var scenarios = map[string]func() error{}

func TestMain(m *testing.M) {
	if name := os.Getenv(scenarioEnv); name != "" {
		if err := scenarios[name](); err != nil {
			fmt.Fprintln(os.Stderr, "scenario", name, "failed:", err)
			os.Exit(1)
		}
		fmt.Println("scenario ok")
		os.Exit(0)
	}
	os.Exit(m.Run())
}

var fakeNVML struct {
	once sync.Once
	path string
	err  error
}

// fakeNVMLSource is the fake NVML's C file: in $MEMPROBE_FAKE_GPU_DIR when
// set, else in the repository's tests/fake-gpu beside this package; "" when
// neither has it (a copy of bindings/go outside the repository).
func fakeNVMLSource() string {
	for _, dir := range []string{os.Getenv("MEMPROBE_FAKE_GPU_DIR"), filepath.Join("..", "..", "tests", "fake-gpu")} {
		if dir == "" {
			continue
		}
		p := filepath.Join(dir, "fake_nvml.c")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return ""
}

// stageNVML copies the fake NVML (built once) into a fresh directory with
// script beside it. It skips the test when the fake's source is not here.
func stageNVML(t *testing.T, script string) string {
	t.Helper()
	src := fakeNVMLSource()
	if src == "" {
		t.Skip("the fake NVML (tests/fake-gpu/fake_nvml.c of memprobe's repository) is not beside this package, " +
			"as in a copy of bindings/go outside the repository: set MEMPROBE_FAKE_GPU_DIR to that folder to run this test")
	}
	fakeNVML.once.Do(func() {
		dir, err := os.MkdirTemp("", "memprobe-go-fake-nvml")
		if err != nil {
			fakeNVML.err = err
			return
		}
		fakeNVML.path = filepath.Join(dir, "libnvidia-ml.so.1")
		out, err := exec.Command("cc", "-shared", "-fPIC", "-Wall", "-Wextra", "-Werror", "-o", fakeNVML.path,
			src, "-lpthread").CombinedOutput()
		if err != nil {
			fakeNVML.err = fmt.Errorf("cc: %v\n%s", err, out)
		}
	})
	if fakeNVML.err != nil {
		t.Fatal(fakeNVML.err)
	}
	dir := t.TempDir()
	lib := filepath.Join(dir, "libnvidia-ml.so.1")
	b, err := os.ReadFile(fakeNVML.path)
	ok(t, err)
	ok(t, os.WriteFile(lib, b, 0o755))
	ok(t, os.WriteFile(filepath.Join(dir, "fake_nvml.script"), []byte(script), 0o644))
	return lib
}

func runScenario(t *testing.T, name string, env ...string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CUDA_VISIBLE_DEVICES=") && !strings.HasPrefix(kv, "MEMPROBE_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, scenarioEnv+"="+name)
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "scenario ok") {
		t.Fatalf("scenario %s: %v\n%s", name, err, out)
	}
}

func expect(cond bool, format string, args ...any) error {
	if !cond {
		return fmt.Errorf(format, args...)
	}
	return nil
}

func first(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

func init() {
	scenarios["nogpu"] = func() error {
		m, err := GPUMemGet(CurrentDevice)
		n, cerr := GPUCount()
		all, aerr := GPUMemGetAll()
		id, free, merr := GPUWithMaxFreeMem()
		b, berr := GPUBackendInUse()
		return first(
			expect(errors.Is(err, ErrUnavailable) && m == (GPUMemory{}), "mem get: %+v %v", m, err),
			expect(n == 0 && errors.Is(cerr, ErrUnavailable), "count %d %v", n, cerr),
			expect(len(all) == 0 && errors.Is(aerr, ErrUnavailable), "all %v %v", all, aerr),
			expect(id == -1 && free == 0 && errors.Is(merr, ErrUnavailable), "max %d %d %v", id, free, merr),
			expect(berr == nil && b == BackendNone, "backend %v %v", b, berr),
		)
	}
	scenarios["devices"] = func() error {
		n, err := GPUCount()
		if err != nil || n != 2 {
			return fmt.Errorf("count %d %v", n, err)
		}
		m0, err0 := GPUMemGet(0)
		t0, f0, u0 := m0.MB()
		m1, _ := GPUMemGet(1)
		bad, berr := GPUMemGet(7)
		all, aerr := GPUMemGetAll()
		id, free, merr := GPUWithMaxFreeMem()
		info, ierr := GPUInfoOf(0)
		freeNow, ferr := GPUMemGetFree()
		usedNow, uerr := GPUMemGetUsed()
		if err := SetGPUCurrentDevice(1); err != nil {
			return err
		}
		cur, _ := GPUCurrentDevice()
		dev, derr := OpenGPUDevice(0)
		if derr != nil {
			return derr
		}
		fast, fastErr := dev.UsedFast()
		dm, _ := dev.MemGet()
		live, _ := GPULiveDevices()
		dev.Close()
		liveAfter, _ := GPULiveDevices()
		return first(
			expect(err0 == nil && m0.Read && t0 == 16384 && u0 == 2048 && f0 == 14336, "gpu0 %+v %v", m0, err0),
			expect(m1.HasReserved && m1.Reserved == 256<<20 && m1.Free == 8*gib-gib-256<<20, "gpu1 %+v", m1),
			expect(errors.Is(berr, ErrInvalidID) && bad == (GPUMemory{}), "bad id %+v %v", bad, berr),
			expect(aerr == nil && len(all) == 2 && all[0].Total == 16*gib, "all %+v %v", all, aerr),
			expect(merr == nil && id == 0 && free == 14*gib, "max %d %d %v", id, free, merr),
			expect(ierr == nil && info.Name == "Fake GPU A" && info.UUID != "" && info.Backend == BackendNVML, "info %+v %v", info, ierr),
			expect(ferr == nil && uerr == nil && freeNow == 14*gib && usedNow == 2*gib, "free/used %d %d", freeNow, usedNow),
			expect(cur == 1, "current %d", cur),
			expect(fastErr == nil && fast == 2*gib && dm.Used == 2*gib, "fast %d %+v", fast, dm),
			expect(live == 1 && liveAfter == 0, "live %d %d", live, liveAfter),
		)
	}
	scenarios["cache"] = func() error {
		calls := 0
		if err := SetGPUCacheRelease(func() error { calls++; return nil }); err != nil {
			return err
		}
		f, err := GPUMemGetFreeNoCache()
		u, uerr := GPUMemGetUsedNoCache()
		ok := calls == 2
		SetGPUCacheRelease(func() error { return errors.New("no") })
		_, berr := GPUMemGetFreeNoCache()
		SetGPUCacheRelease(nil)
		_, nerr := GPUMemGetFreeNoCache()
		return first(
			expect(err == nil && uerr == nil && f == 15*gib && u == gib, "no cache %d %d %v %v", f, u, err, uerr),
			expect(ok, "release calls %d", calls),
			expect(errors.Is(berr, ErrUnavailable), "failing release %v", berr),
			expect(nerr == nil, "after removal %v", nerr),
			expect(callbacks.len() == 0, "registered callbacks left: %d", callbacks.len()),
		)
	}
	scenarios["window"] = func() error {
		SetMonitorInterval(2 * time.Millisecond)
		src, err := NewGPUDevice(0)
		if err != nil {
			return err
		}
		proc, err := NewGPUProcess(0)
		if err != nil {
			return err
		}
		si, _ := src.Info()
		pi, _ := proc.Info()
		w, err := OpenWindow(src, proc)
		if err != nil {
			return err
		}
		time.Sleep(150 * time.Millisecond)
		peak, perr := w.Peak(0)
		ps, _ := proc.Read()
		w.Close()
		return first(
			expect(si.Kind == KindGPUDevice && si.Fidelity == Sampled && si.Name == "gpu0", "info %+v", si),
			expect(pi.Kind == KindGPUProcess && pi.Name == "gpu0.proc", "proc info %+v", pi),
			expect(perr == nil && peak == 9*gib, "peak %d %v", peak, perr),
			expect(ps.Used == 512<<20, "proc used %d", ps.Used),
			expect(src.LastError() == nil, "last error %v", src.LastError()),
		)
	}
	scenarios["lost"] = func() error {
		src, err := NewGPUDevice(0)
		if err != nil {
			return err
		}
		var lost error
		for i := 0; i < 4; i++ {
			if _, err := src.Read(); err != nil {
				lost = err
			}
		}
		last := src.LastError()
		return first(
			expect(errors.Is(lost, ErrGPULost), "read error %v", lost),
			expect(errors.Is(last, ErrGPULost), "last error %v", last),
		)
	}
}

func TestGPUNoGPU(t *testing.T) {
	runScenario(t, "nogpu", "MEMPROBE_GPU_BACKEND=none")
}

func TestGPUReadings(t *testing.T) {
	lib := stageNVML(t, fmt.Sprintf("device 0 name Fake GPU A\ndevice 0 total %d\ndevice 0 used %d\ndevice 1 total %d\ndevice 1 used %d\ndevice 1 reserved %d\n",
		16*gib, 2*gib, 8*gib, gib, 256<<20))
	runScenario(t, "devices", "MEMPROBE_GPU_BACKEND=nvml", "MEMPROBE_NVML_LIBRARY="+lib)
}

func TestGPUCacheRelease(t *testing.T) {
	lib := stageNVML(t, fmt.Sprintf("device 0 total %d\ndevice 0 used %d\n", 16*gib, gib))
	runScenario(t, "cache", "MEMPROBE_GPU_BACKEND=nvml", "MEMPROBE_NVML_LIBRARY="+lib)
}

func TestGPUWindow(t *testing.T) {
	lib := stageNVML(t, fmt.Sprintf("device 0 total %d\ndevice 0 timeline 0:%d 30:%d 60:%d\ndevice 0 procs self:%d\n",
		16*gib, gib, 9*gib, gib, 512<<20))
	runScenario(t, "window", "MEMPROBE_GPU_BACKEND=nvml", "MEMPROBE_NVML_LIBRARY="+lib)
}

func TestGPULost(t *testing.T) {
	lib := stageNVML(t, fmt.Sprintf("device 0 total %d\ndevice 0 used %d\ndevice 0 lost_at 3\n", 16*gib, gib))
	runScenario(t, "lost", "MEMPROBE_GPU_BACKEND=nvml", "MEMPROBE_NVML_LIBRARY="+lib)
}

// In this test process the machine decides: a real GPU, or none. Either
// way the calls answer without crashing, and a real GPU reads sensibly.
func TestGPUThisMachine(t *testing.T) {
	n, err := GPUCount()
	if n == 0 {
		if err != nil && !errors.Is(err, ErrUnavailable) {
			t.Fatal(err)
		}
		if m, err := GPUMemGet(CurrentDevice); m != (GPUMemory{}) || err == nil {
			t.Fatalf("no GPU but %+v %v", m, err)
		}
		t.Log("no GPU here:", err)
		return
	}
	m := must(GPUMemGet(0))(t)
	if m.Total == 0 || m.Used > m.Total || !m.Read {
		t.Fatalf("%+v", m)
	}
	d := must(OpenGPUDevice(0))(t)
	defer d.Close()
	if u := must(d.UsedFast())(t); u == 0 || u > m.Total {
		t.Fatal(u)
	}
	src := must(NewGPUDevice(0))(t)
	defer src.Close()
	if s := must(src.Read())(t); !s.HasTotal || s.Total != m.Total {
		t.Fatalf("%+v", s)
	}
	info := must(GPUInfoOf(0))(t)
	t.Logf("GPU 0: %+v, %d MiB used of %d", info, m.Used>>20, m.Total>>20)
}
