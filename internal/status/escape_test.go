package status

import (
	"os"
	"strings"
	"testing"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
)

// Hostile host, round 2, class 8: a DEL or a C1 control (or a byte that is
// not UTF-8) in the pin or in kubeadm's error line made the YAML encoder
// refuse the document: the write failed and `status` showed the previous
// pass's Converged. Whatever the input, the document written is this
// pass's, with those bytes escaped.
func TestWriteEscapesWhatYAMLCannotCarry(t *testing.T) {
	root := paths.Root(t.TempDir())
	if err := Write(root, Document{Phase: PhaseConverged, Member: true, NodeVersion: "v1.36.3"}); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"\x7f", "\u0085", "\u009b", "\u009f", "\x80", "\x9b"} {
		doc := Document{Phase: PhaseRefused, Pin: "v1.37.2" + bad, Message: "[ERROR CreateJob]: boom" + bad + "[2J",
			Warnings: []string{"w" + bad}, Events: []Event{{Type: "Warning", Reason: "UpgradeRefused", Message: "m" + bad}}}
		if err := Write(root, doc); err != nil {
			t.Fatalf("%q: %v", bad, err)
		}
		for _, p := range []string{paths.StatusFile, paths.StatusMirror} {
			d, err := Read(root, p)
			if err != nil {
				t.Fatalf("%q: %s: %v", bad, p, err)
			}
			want := Printable(bad)
			if d.Phase != PhaseRefused || d.Pin != "v1.37.2"+want || d.Message != "[ERROR CreateJob]: boom"+want+"[2J" ||
				len(d.Warnings) != 1 || d.Warnings[0] != "w"+want || len(d.Events) != 1 || d.Events[0].Message != "m"+want {
				t.Fatalf("%q: %s holds %+v; want this pass's document, escaped as %q", bad, p, d, want)
			}
		}
		d, src, err := ReadCurrent(root)
		if err != nil || src != paths.StatusFile || d.Phase != PhaseRefused {
			t.Fatalf("%q: ReadCurrent %s %+v %v", bad, src, d, err)
		}
	}
}

// An etcd member name of 16 MiB (or any field that large, or thousands of
// warnings) gives a document the readers accept: each field is bounded and
// the whole stays under MaxSize.
func TestWriteBoundsTheDocumentUnderTheReadersBound(t *testing.T) {
	root := paths.Root(t.TempDir())
	huge := strings.Repeat("m", 16<<20)
	many := make([]string, 5000)
	for i := range many {
		many[i] = "etcd member " + strings.Repeat("n", 2000) + " is below 3.6"
	}
	for name, doc := range map[string]Document{
		"member-name": {Phase: PhaseUpgrading, Warnings: []string{"etcd member " + huge + " is at 3.5.0"}, Message: huge},
		"many":        {Phase: PhaseUpgrading, Warnings: many, Events: []Event{{Message: huge}, {Message: huge}}},
		"controls":    {Phase: PhaseUpgrading, Message: strings.Repeat("\x7f", 16<<20)},
	} {
		if err := Write(root, doc); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		d, err := Read(root, paths.StatusFile)
		if err != nil || d.Phase != PhaseUpgrading {
			t.Fatalf("%s: the written document is refused by Read: %v", name, err)
		}
		if len(d.Message) > MaxField {
			t.Fatalf("%s: a message of %d bytes", name, len(d.Message))
		}
	}
}

// docs/reference.md, The status document: "each is at most 4 KiB and each
// list at most 64 entries, so whatever a pin or kubeadm's error line
// holds, the document of the pass is written and stays under the 1 MiB
// its readers accept"; what-it-refuses.md: `status` refuses "one over
// 1 MiB". The bounds are the page's numbers, written as it writes them.
func TestTheDocumentedBounds(t *testing.T) {
	const field, items, readers = 4 << 10, 64, 1 << 20
	root := paths.Root(t.TempDir())
	long := strings.Repeat("x", 64<<10)
	many := make([]string, 1000)
	for i := range many {
		many[i] = "warning"
	}
	d := Document{Phase: PhaseFailed, Message: long, Pin: long, Warnings: many, Actions: many[:items]}
	if err := Write(root, d); err != nil {
		t.Fatal(err)
	}
	got, err := Read(root, paths.StatusFile)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Message) > field || len(got.Pin) > field || len(got.Message) < field/2 {
		t.Errorf("fields of %d and %d bytes, want at most %d (and not cut far shorter)", len(got.Message), len(got.Pin), field)
	}
	if len(got.Warnings) > items || !strings.Contains(got.Warnings[len(got.Warnings)-1], "not shown") {
		t.Errorf("%d warnings of 1000, want at most %d, the last saying how many were left out", len(got.Warnings), items)
	}
	if len(got.Actions) != items {
		t.Errorf("%d actions of %d: a list at the bound is kept whole", len(got.Actions), items)
	}
	// A document over the readers' bound (hand-written) is refused; one
	// at it is read.
	full := root.Path(paths.StatusFile)
	at := []byte("phase: Converged\nmessage: " + strings.Repeat("y", readers-len("phase: Converged\nmessage: ")-1) + "\n")
	if err := os.WriteFile(full, at, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(root, paths.StatusFile); err != nil {
		t.Errorf("a document of exactly 1 MiB: %v", err)
	}
	if err := os.WriteFile(full, append(at, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(root, paths.StatusFile); err == nil {
		t.Error("a document over 1 MiB was read")
	}
}
