package restore

import (
	"strings"
	"testing"
	"time"
)

// FuzzParse: arbitrary bytes as the etcd manifest to put back and as
// etcdutl's status output never panic, and whatever parses is decided on
// without panicking, a plan only for a member the parser vouched for.
func FuzzParse(f *testing.F) {
	f.Add([]byte(KubeadmManifest("cp2", "registry.k8s.io/etcd:3.6.8-0", "10.0.0.12", 2379, 2380, 2381, "cp1=https://10.0.0.11:2380,cp2=https://10.0.0.12:2380", true)),
		[]byte(`{"hash":1,"revision":2,"totalKey":1,"totalSize":20480,"version":"3.6.0"}`), "cp2=https://10.0.0.12:2380")
	f.Add([]byte("spec:\n  containers:\n  - name: etcd\n    command: [\"--name=a=b\", \"--data-dir=/\"]\n"), []byte(`{}`), "")
	f.Fuzz(func(t *testing.T, manifest, statusOut []byte, ic string) {
		s, serr := parseStatus(statusOut, 1<<20)
		m, err := ParseMember(manifest)
		if err != nil {
			return
		}
		if m.Name == "" || !strings.HasPrefix(m.DataDir, "/") || len(m.PeerURLs) == 0 {
			t.Fatalf("parsed a member without name, data dir or peer URL: %+v", m)
		}
		facts := Facts{Member: m, Etcdutl: "3.6.8", Snapshot: s, SnapshotErr: serr, HasMember: true}
		p, err := Decide(facts, Request{Snapshot: "/s.db", Manifests: "/m", InitialCluster: ic, Token: "etcd-restore-0000000000000000", Now: time.Unix(0, 0)})
		if err == nil && (p.Member.Name != m.Name || !strings.HasPrefix(p.Staging, m.DataDir+"/member.restoring-")) {
			t.Fatalf("plan %+v for member %+v", p, m)
		}
	})
}
