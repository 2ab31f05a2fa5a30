package memprobe

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// consumerMain is a program of another module using this package.
const consumerMain = `package main

import (
	"fmt"
	"os"
	"syscall"

	"memprobe.dev/memprobe"
)

func run() error {
	rss, err := memprobe.NewProcess()
	if err != nil {
		return err
	}
	defer rss.Close()
	w, err := memprobe.OpenWindow(rss)
	if err != nil {
		return err
	}
	defer w.Close()
	const n = 64 << 20
	b, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		return err
	}
	for i := 0; i < n; i += 4096 {
		b[i] = 1
	}
	if err := syscall.Munmap(b); err != nil {
		return err
	}
	ended, err := w.Reset()
	if err != nil {
		return err
	}
	fmt.Printf("memprobe %s start %d peak %d\n", memprobe.Version(), ended[0].UsedStart, ended[0].Peak)
	return nil
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "consumer:", err)
		os.Exit(1)
	}
}
`

// copyModule copies this module's files (not its tests) into dir: what
// `go get` would put in the module cache, with nothing of the repository
// around it.
func copyModule(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		name := e.Name()
		if !e.Type().IsRegular() || strings.HasSuffix(name, "_test.go") {
			continue
		}
		data, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// withoutCgoFlags is the environment minus anything that would point cgo
// at the header or the library: pkg-config must do it alone.
func withoutCgoFlags(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch name {
		case "CGO_CFLAGS", "CGO_CPPFLAGS", "CGO_CXXFLAGS", "CGO_LDFLAGS", "GOFLAGS", "GOWORK", "LD_LIBRARY_PATH":
			continue
		}
		env = append(env, kv)
	}
	return append(env, extra...)
}

// TestOutsideModule builds and runs a program of a module outside the
// repository that requires memprobe.dev/memprobe through a replace
// directive, against the memprobe that pkg-config finds (an installed
// prefix: PKG_CONFIG_PATH=<prefix>/lib/pkgconfig), with no CGO_CFLAGS or
// CGO_LDFLAGS.
func TestOutsideModule(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is not on PATH: %v", err)
	}
	out, err := exec.Command("pkg-config", "--variable=libdir", "memprobe").Output()
	if err != nil {
		t.Fatalf("pkg-config does not find memprobe (install it; PKG_CONFIG_PATH=<prefix>/lib/pkgconfig): %v", err)
	}
	libdir := strings.TrimSpace(string(out))

	tmp := t.TempDir()
	mod := filepath.Join(tmp, "memprobe")
	copyModule(t, mod)
	app := filepath.Join(tmp, "app")
	if err := os.MkdirAll(app, 0o755); err != nil {
		t.Fatal(err)
	}
	goMod := fmt.Sprintf("module example.com/app\n\ngo 1.21\n\nrequire memprobe.dev/memprobe v0.0.0\n\nreplace memprobe.dev/memprobe => %s\n", mod)
	for name, text := range map[string]string{"go.mod": goMod, "main.go": consumerMain} {
		if err := os.WriteFile(filepath.Join(app, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	exe := filepath.Join(tmp, "consumer")
	build := exec.Command(goTool, "build", "-o", exe, ".")
	build.Dir = app
	build.Env = withoutCgoFlags("CGO_ENABLED=1", "GOWORK=off", "GOPROXY=off", "GOFLAGS=-mod=mod")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build in a module outside the repository: %v\n%s", err, out)
	}
	run := exec.Command(exe)
	run.Env = withoutCgoFlags("LD_LIBRARY_PATH=" + libdir)
	got, err := run.CombinedOutput()
	if err != nil {
		t.Fatalf("consumer: %v\n%s", err, got)
	}
	var version string
	var start, peak uint64
	if _, err := fmt.Sscanf(string(got), "memprobe %s start %d peak %d", &version, &start, &peak); err != nil {
		t.Fatalf("consumer's output %q: %v", got, err)
	}
	if version != Version() {
		t.Errorf("the consumer ran memprobe %s, this package %s", version, Version())
	}
	if peak < start+64*MiB-slack {
		t.Errorf("peak %d misses the 64 MiB spike over %d", peak, start)
	}
}
