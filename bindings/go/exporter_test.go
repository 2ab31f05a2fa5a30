package memprobe

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func scrape(t *testing.T, e *Exporter) (string, error) {
	t.Helper()
	url := must(e.URL())(t)
	c := http.Client{Timeout: 10 * time.Second}
	r, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer r.Body.Close()
	b, err := io.ReadAll(r.Body)
	return string(b), err
}

func TestExporter(t *testing.T) {
	checkLeaks(t)
	a := pushedAt(t, "alloc", 100*MiB)
	e := must(StartExporter(""))(t)
	defer e.Close()
	ok(t, e.AddSource(a))
	ok(t, e.SetRank(3, 1, 8))
	tr := must(NewTracker(a))(t)
	defer tr.Close()
	ok(t, e.WatchTracker(tr))
	ok(t, tr.Begin(Epoch, ""))
	ok(t, tr.Begin(Step, ""))
	ok(t, a.Push(300*MiB))
	ok(t, a.Push(120*MiB))
	must(tr.End(Step, ""))(t)
	must(tr.End(Epoch, ""))(t)
	text := must(scrape(t, e))(t)
	for _, want := range []string{`memprobe_source_used_bytes{`, `source="alloc"`, fmt.Sprint(120 * MiB),
		`memprobe_phase_peak_bytes{`, `phase="step"`, fmt.Sprint(300 * MiB), `rank="3"`, `world_size="8"`} {
		if !strings.Contains(text, want) {
			t.Fatalf("no %q in:\n%s", want, text)
		}
	}
	ok(t, e.AddGPUs(true))
	must(scrape(t, e))(t)
	ok(t, e.Stop())
	if err := e.Stop(); !errors.Is(err, ErrWrongOrder) {
		t.Fatal(err)
	}
	if _, err := scrape(t, e); err == nil {
		t.Fatal("a stopped exporter answered")
	}
	if p := must(e.Port())(t); p == 0 {
		t.Fatal("port 0")
	}
	ok(t, e.Close())
	ok(t, e.Close())
	if _, err := e.Port(); !errors.Is(err, ErrInvalidHandle) {
		t.Fatal(err)
	}
}

func TestExporterAddresses(t *testing.T) {
	if _, err := StartExporter("not an address"); !errors.Is(err, ErrInvalidArgument) {
		t.Fatal(err)
	}
	first := must(StartExporter("127.0.0.1:0"))(t)
	defer first.Close()
	p := must(first.Port())(t)
	_, err := StartExporter(fmt.Sprintf("127.0.0.1:%d", p))
	var me *Error
	if !errors.Is(err, ErrIO) || !errors.As(err, &me) || !strings.Contains(me.Message, "in use") {
		t.Fatal(err)
	}
}

// bcrypt (cost 4) of "s3cret"; goodAuth is base64 of "user:s3cret".
const (
	webHash  = "$2b$04$DLse4tY1yMwulgkiUjPoOuY7.3QEz2D0lKkl1cubv8IH8v4FRjdf2"
	goodAuth = "Basic dXNlcjpzM2NyZXQ="
)

func status(t *testing.T, e *Exporter, auth string) int {
	t.Helper()
	req := must(http.NewRequest("GET", must(e.URL())(t), nil))(t)
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	c := http.Client{Timeout: 10 * time.Second}
	r := must(c.Do(req))(t)
	r.Body.Close()
	return r.StatusCode
}

func replaceFile(t *testing.T, path, text string) {
	t.Helper()
	ok(t, os.WriteFile(path+".tmp", []byte(text), 0o644))
	ok(t, os.Rename(path+".tmp", path))
}

func TestExporterWebConfig(t *testing.T) {
	checkLeaks(t)
	web := filepath.Join(t.TempDir(), "web.yml")
	replaceFile(t, web, "basic_auth_users:\n  user: '"+webHash+"'\n")
	e := must(StartExporterWithWebConfig("", web))(t)
	defer e.Close()
	if s := status(t, e, ""); s != 401 {
		t.Fatalf("no password: %d", s)
	}
	if s := status(t, e, "Basic dXNlcjp3cm9uZw=="); s != 401 {
		t.Fatalf("a wrong password: %d", s)
	}
	if s := status(t, e, goodAuth); s != 200 {
		t.Fatalf("the right password: %d", s)
	}
	ok(t, e.WebConfigError())
	// A broken file while serving: refused, reported, the last good one kept.
	replaceFile(t, web, "basic_auth_users:\n  user: '"+webHash+"'\nbasic_auth_userz: {}\n")
	deadline := time.Now().Add(10 * time.Second)
	var err error
	for err = e.WebConfigError(); err == nil; err = e.WebConfigError() {
		if time.Now().After(deadline) {
			t.Fatal("the broken file was not noticed")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !errors.Is(err, ErrParse) || !strings.Contains(err.Error(), "basic_auth_userz") {
		t.Fatalf("want a parse error naming the key, got %v", err)
	}
	if s := status(t, e, goodAuth); s != 200 {
		t.Fatalf("the last good file: %d", s)
	}
	ok(t, e.Close())
	if err := e.WebConfigError(); !errors.Is(err, ErrInvalidHandle) {
		t.Fatalf("after Close: %v", err)
	}
}

func TestExporterWebConfigFailsTheStart(t *testing.T) {
	dir := t.TempDir()
	if _, err := StartExporterWithWebConfig("", filepath.Join(dir, "absent.yml")); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("a missing file: %v", err)
	}
	bad := filepath.Join(dir, "bad.yml")
	replaceFile(t, bad, "tls_server_config:\n  cert_flie: x\n")
	if _, err := StartExporterWithWebConfig("", bad); !errors.Is(err, ErrParse) || !strings.Contains(err.Error(), "cert_flie") {
		t.Fatalf("an unknown key: %v", err)
	}
}
