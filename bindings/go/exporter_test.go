package memprobe

import (
	"errors"
	"fmt"
	"io"
	"net/http"
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
