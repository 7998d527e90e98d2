package status

import (
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
