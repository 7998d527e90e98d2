package plugin

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	pluggable "github.com/mudler/go-pluggable"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
)

// A go-pluggable agent.boot event whose JSON is exactly n bytes: the data
// is a string padded with spaces, which the JSON decoder accepts.
// documentedEvent is the bound what-it-refuses.md states: "It refuses an
// event over 8 MiB", and a data file over it.
const documentedEvent = 8 << 20

func eventOfSize(t *testing.T, n int) []byte {
	t.Helper()
	b, _ := json.Marshal(pluggable.Event{Name: EventBoot, Data: ""})
	if n < len(b) {
		t.Fatalf("an event cannot be smaller than %d bytes", len(b))
	}
	return append(b, bytes.Repeat([]byte(" "), n-len(b))...)
}

// Over 8 MiB on stdin, kairos-agent's event is refused before it is parsed
// (the bound what-it-refuses.md states), naming the bound, and
// nothing is written under the root; exactly 8 MiB is read.
func TestEventOverEightMiBIsRefused(t *testing.T) {
	if _, err := readEvent(bytes.NewReader(eventOfSize(t, documentedEvent))); err != nil {
		t.Fatalf("an event of exactly %d bytes: %v", documentedEvent, err)
	}
	root := t.TempDir()
	var out bytes.Buffer
	err := Serve(context.Background(), Options{Root: paths.Root(root)}, string(EventBoot), bytes.NewReader(eventOfSize(t, documentedEvent+1)), &out)
	if err == nil || !strings.Contains(err.Error(), "over "+strconv.Itoa(documentedEvent)+" bytes") {
		t.Fatalf("an event of %d bytes: %v, want it refused as over the bound", documentedEvent+1, err)
	}
	var resp pluggable.EventResponse
	if jerr := json.Unmarshal(out.Bytes(), &resp); jerr != nil || resp.Error != err.Error() {
		t.Fatalf("response %q (%v), want the error %q", out.String(), jerr, err)
	}
	if entries, _ := os.ReadDir(root); len(entries) != 0 {
		t.Fatalf("a refused event wrote %v", entries)
	}
}

// Data over 8 KiB arrives in the event's file: that file is read bounded
// too, 8 MiB at most, and one byte more is refused naming the path.
func TestEventDataFileOverEightMiBIsRefused(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, n int) string {
		p := filepath.Join(dir, name)
		payload, _ := json.Marshal(map[string]string{"config": "#cloud-config\n"})
		if err := os.WriteFile(p, append(payload, bytes.Repeat([]byte(" "), n-len(payload))...), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	event := func(file string) []byte {
		b, _ := json.Marshal(pluggable.Event{Name: EventBoot, File: file})
		return b
	}

	at := write("at-bound", documentedEvent)
	ev, err := readEvent(bytes.NewReader(event(at)))
	if err != nil || len(ev.Data) != documentedEvent || ev.File != "" {
		t.Fatalf("a data file of exactly %d bytes: %d bytes read, file %q, %v", documentedEvent, len(ev.Data), ev.File, err)
	}

	over := write("over-bound", documentedEvent+1)
	ev, err = readEvent(bytes.NewReader(event(over)))
	if err == nil || !strings.Contains(err.Error(), "read the event's data file") || !strings.Contains(err.Error(), over) {
		t.Fatalf("a data file of %d bytes: %d bytes read, %v; want it refused, naming the file", documentedEvent+1, len(ev.Data), err)
	}
}

// The event's file must be an absolute path: a relative one would be
// resolved against whatever directory the plugin was started in. A file
// that is there under that relative name is still not read.
func TestEventDataFileMustBeAbsolute(t *testing.T) {
	dir := t.TempDir()
	payload, _ := json.Marshal(map[string]string{"config": "#cloud-config\n"})
	if err := os.WriteFile(filepath.Join(dir, "pluggable123"), payload, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	b, _ := json.Marshal(pluggable.Event{Name: EventBoot, File: "pluggable123"})
	ev, err := readEvent(bytes.NewReader(b))
	if err == nil || !strings.Contains(err.Error(), `the event's data file "pluggable123" is not an absolute path`) {
		t.Fatalf("a relative data file: data %q, %v; want it refused", ev.Data, err)
	}
}
