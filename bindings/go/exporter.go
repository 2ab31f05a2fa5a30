package memprobe

/*
#include <stdlib.h>
#include "memprobe.h"
*/
import "C"

import (
	"fmt"
	"runtime"
	"sync"
)

// Exporter serves GET /metrics in the Prometheus text format from this
// process: its sources' readings, the last ended phases of the trackers it
// watches, and optionally the GPUs as DCGM exporter's gauges
// (docs/metrics.md). Scrapes are answered by the exporter's own threads.
type Exporter struct {
	h    *C.memprobe_exporter
	once sync.Once
}

// StartExporter listens on addr ("IP:PORT"; "" for 127.0.0.1 on a free
// port). Rank labels come from RANK, LOCAL_RANK and WORLD_SIZE when set.
func StartExporter(addr string) (*Exporter, error) {
	caddr := cString(addr, true)
	defer freeCString(caddr)
	var h *C.memprobe_exporter
	if err := call(func() C.memprobe_status { return C.memprobe_exporter_start(caddr, &h) }); err != nil {
		return nil, err
	}
	e := &Exporter{h: h}
	runtime.SetFinalizer(e, (*Exporter).Close)
	return e, nil
}

// StartExporterWithWebConfig listens on addr as StartExporter does, served
// as the web configuration file webConfig says: Prometheus
// exporter-toolkit's YAML (node_exporter's --web.config.file), with TLS
// (tls_server_config) and passwords (basic_auth_users, bcrypt); see
// docs/metrics.md. The file is re-read when it changes; a bad new file keeps
// the last good one and WebConfigError says why. A file that cannot be read
// or has an unknown key fails the start (never plain HTTP instead).
func StartExporterWithWebConfig(addr, webConfig string) (*Exporter, error) {
	caddr := cString(addr, true)
	defer freeCString(caddr)
	cfile := cString(webConfig, false)
	defer freeCString(cfile)
	var h *C.memprobe_exporter
	if err := call(func() C.memprobe_status {
		return C.memprobe_exporter_start_with_web_config(caddr, cfile, &h)
	}); err != nil {
		return nil, err
	}
	e := &Exporter{h: h}
	runtime.SetFinalizer(e, (*Exporter).Close)
	return e, nil
}

// WebConfigError says why the last re-read of the web configuration was
// refused (the last good one is still served); nil when the last read was
// good or there is no web configuration.
func (e *Exporter) WebConfigError() error {
	return storedError(func(st *C.memprobe_status, buf *C.char, size C.size_t, needed *C.size_t) error {
		return e.do(func(h *C.memprobe_exporter) C.memprobe_status {
			return C.memprobe_exporter_get_web_config_error(h, st, buf, size, needed)
		})
	})
}

func (e *Exporter) do(f func(*C.memprobe_exporter) C.memprobe_status) error {
	err := call(func() C.memprobe_status { return f(e.h) })
	runtime.KeepAlive(e)
	return err
}

// Port is the port it listens on (also after Stop).
func (e *Exporter) Port() (int, error) {
	var p C.uint16_t
	err := e.do(func(h *C.memprobe_exporter) C.memprobe_status { return C.memprobe_exporter_port(h, &p) })
	return int(p), err
}

// URL is http://127.0.0.1:<port>/metrics, for a local scrape.
func (e *Exporter) URL() (string, error) {
	p, err := e.Port()
	return fmt.Sprintf("http://127.0.0.1:%d/metrics", p), err
}

// AddSource exports s's readings, read at each scrape (the exporter keeps
// its own reference).
func (e *Exporter) AddSource(s *Source) error {
	err := e.do(func(h *C.memprobe_exporter) C.memprobe_status { return C.memprobe_exporter_add_source(h, s.h) })
	runtime.KeepAlive(s)
	return err
}

// WatchTracker exports t's sources and the records of its ended steps,
// epochs, experiences and streams, its releases and leak flags.
func (e *Exporter) WatchTracker(t *Tracker) error {
	err := e.do(func(h *C.memprobe_exporter) C.memprobe_status { return C.memprobe_exporter_watch_tracker(h, t.h) })
	runtime.KeepAlive(t)
	return err
}

// SetRank sets the rank labels; a negative value leaves that label out.
func (e *Exporter) SetRank(rank, localRank, worldSize int) error {
	return e.do(func(h *C.memprobe_exporter) C.memprobe_status {
		return C.memprobe_exporter_set_rank(h, C.int64_t(rank), C.int64_t(localRank), C.int64_t(worldSize))
	})
}

// AddGPUs exports the GPUs as DCGM_FI_DEV_FB_USED / _FREE / _TOTAL (MiB),
// and each process's memory on them when withProcesses.
func (e *Exporter) AddGPUs(withProcesses bool) error {
	var w C.int32_t
	if withProcesses {
		w = 1
	}
	return e.do(func(h *C.memprobe_exporter) C.memprobe_status { return C.memprobe_exporter_add_gpus(h, w) })
}

// Stop stops serving and frees the port (ErrWrongOrder when already stopped).
func (e *Exporter) Stop() error {
	return e.do(func(h *C.memprobe_exporter) C.memprobe_status { return C.memprobe_exporter_stop(h) })
}

// Close stops serving if needed and releases the exporter. Closing twice
// is a no-op.
func (e *Exporter) Close() error {
	var err error
	e.once.Do(func() {
		runtime.SetFinalizer(e, nil)
		err = call(func() C.memprobe_status { return C.memprobe_exporter_free(e.h) })
	})
	return err
}
