package plugin

import (
	"bytes"
	"testing"
)

// FuzzReadEvent feeds arbitrary bytes as the go-pluggable event kairos-agent
// writes on stdin: readEvent never panics, never returns more than the
// bound, and never hands on a data file it did not read itself.
func FuzzReadEvent(f *testing.F) {
	f.Add([]byte(`{"name":"agent.boot","data":"{\"config\":\"#cloud-config\\n\"}","file":""}`))
	f.Add([]byte(`{"name":"agent.boot","data":"","file":"relative"}`))
	f.Add([]byte(`{"name":"agent.boot","file":"/proc/self/fd/0"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		ev, err := readEvent(bytes.NewReader(b))
		if err != nil {
			return
		}
		if ev.File != "" || len(ev.Data) > MaxEventSize {
			t.Fatalf("event %q: file %q, %d bytes of data", b, ev.File, len(ev.Data))
		}
	})
}
