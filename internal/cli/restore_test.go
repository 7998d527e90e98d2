package cli

import (
	"os"
	"strings"
	"testing"

	"github.com/kairos-io/provider-kubernetes/internal/reconcile"
)

// restore-etcd's usage errors change nothing and read nothing: exit 2
// before the log is even opened. (Its behaviour on real etcd is proven in
// internal/restore, through Main.)
func TestRestoreEtcdUsage(t *testing.T) {
	root := t.TempDir()
	for _, c := range []struct {
		args []string
		says string
	}{
		{[]string{"--manifests", "/m", "--yes"}, `--snapshot must be a clean absolute path, got ""`},
		{[]string{"--snapshot", "etcd.db", "--manifests", "/m"}, `--snapshot must be a clean absolute path, got "etcd.db"`},
		{[]string{"--snapshot", "/run/etcd-backup/etcd.db"}, `--manifests must be a clean absolute path, got ""`},
		{[]string{"--snapshot", "/s.db", "--manifests", "/etc/kubernetes/../kubernetes/m"}, "--manifests must be a clean absolute path"},
		{[]string{"--snapshot", "/s.db", "--manifests", "/etc/kubernetes/manifests"}, "not /etc/kubernetes/manifests (the kubelet's directory)"},
		{[]string{"--snapshot", "/s.db", "--manifests", "/m", "--root", "relative"}, `--root must be an absolute path, got "relative"`},
		{[]string{"--snapshot", "/s.db", "--manifests", "/m", "extra"}, "unexpected arguments"},
	} {
		args := append([]string{"restore-etcd"}, c.args...)
		if !strings.Contains(strings.Join(c.args, " "), "--root") {
			args = append(args, "--root", root)
		}
		code, out, errOut := run(args...)
		if code != reconcile.ExitUsage || out != "" || !strings.Contains(errOut, c.says) {
			t.Errorf("%v: exit %d stdout %q stderr %q, want 2 saying %q", c.args, code, out, errOut, c.says)
		}
	}
	if ents, _ := os.ReadDir(root); len(ents) != 0 {
		t.Fatalf("a usage error wrote %v", ents)
	}
	code, out, _ := run("help")
	if code != 0 || !strings.Contains(out, "provider-kubernetes restore-etcd --snapshot FILE --manifests DIR --initial-cluster NAME=URL,...") {
		t.Fatalf("help:\n%s", out)
	}
}
