package memprobe

import (
	"errors"
	"os"
	"strings"
	"testing"
)

// The Go test binary never runs with the interposer preloaded: the exact
// source must say so, and how to load it, rather than read zeros.
func TestGPUExactSourceWithoutTheInterposerIsUnavailable(t *testing.T) {
	if strings.Contains(os.Getenv("LD_PRELOAD"), "memprobe_interpose") {
		t.Skip("the interposer is preloaded")
	}
	s, err := NewGPUExactSource(0)
	if s != nil || !errors.Is(err, ErrUnavailable) {
		t.Fatalf("NewGPUExactSource(0) = %v, %v; want ErrUnavailable", s, err)
	}
	for _, want := range []string{"--gpu-exact", "LD_PRELOAD"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if _, err := NewGPUExactSource(64); !errors.Is(err, ErrInvalidID) {
		t.Errorf("NewGPUExactSource(64): %v, want ErrInvalidID", err)
	}
	if KindGPUExact.String() != "exact GPU" {
		t.Errorf("KindGPUExact.String() = %q", KindGPUExact.String())
	}
}
