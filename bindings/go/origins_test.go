package memprobe

import (
	"errors"
	"os"
	"strings"
	"testing"
)

// Without the interposer the origins say how to load it; a bad device is
// refused first.
func TestGPUOriginsWithoutTheInterposerAreUnavailable(t *testing.T) {
	for _, bad := range []int32{64, -2, 1 << 30} {
		if _, err := GPUOriginsLive(bad); !errors.Is(err, ErrInvalidID) {
			t.Errorf("GPUOriginsLive(%d): %v, want ErrInvalidID", bad, err)
		}
		if _, err := GPUOriginsAtPeak(bad); !errors.Is(err, ErrInvalidID) {
			t.Errorf("GPUOriginsAtPeak(%d): %v, want ErrInvalidID", bad, err)
		}
	}
	if strings.Contains(os.Getenv("LD_PRELOAD"), "memprobe_interpose") {
		t.Skip("the interposer is preloaded")
	}
	live, err := GPUOriginsLive(0)
	if live != nil || !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "--gpu-exact") {
		t.Fatalf("GPUOriginsLive(0) = %v, %v; want ErrUnavailable naming --gpu-exact", live, err)
	}
	if _, err := GPUOriginsAtPeak(OriginsHostPinned); !errors.Is(err, ErrUnavailable) {
		t.Errorf("GPUOriginsAtPeak(OriginsHostPinned): %v, want ErrUnavailable", err)
	}
	oom, err := GPUOriginsAtOOM()
	if !errors.Is(err, ErrUnavailable) || oom.Device != OriginsNoOOM || oom.ByOrigin != nil {
		t.Errorf("GPUOriginsAtOOM() = %+v, %v; want ErrUnavailable and no failure", oom, err)
	}
}
