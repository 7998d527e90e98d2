package pin

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kairos-io/provider-kubernetes/internal/testutil"
	"github.com/kairos-io/provider-kubernetes/pkg/version"
)

// custom is the operator's cloud-config, as docs/cloud-config.md has it.
const custom = "#cloud-config\nhostname: cp1\ncluster:\n  cluster_token: Zq8-r4Nd0m-cluster-T0ken-9f3a\n  control_plane_host: 10.0.0.11\n  role: init\n  config: |\n    clusterConfiguration:\n      kubernetesVersion: v1.36.3\n"

// Every way the pin cannot be read or set safely is refused, saying why
// and naming the file, within the bound, and leaves /oem exactly as it was.
func TestSetRefusals(t *testing.T) {
	testutil.RequireRoot(t) // files of other owners
	cases := []struct {
		name  string
		setup func(t *testing.T, n *testutil.Node)
		why   string
		// show: pin show refuses too (it reads what set would write).
		show bool
	}{
		{"no /oem", func(t *testing.T, n *testutil.Node) {}, "/oem does not exist", true},
		{"/oem a symlink", func(t *testing.T, n *testutil.Node) {
			n.Write("/elsewhere/90_custom.yaml", custom, 0o600)
			symlink(t, "elsewhere", n.Path("/oem"))
		}, "/oem is a symlink", true},
		{"/oem a file", func(t *testing.T, n *testutil.Node) { n.Write("/oem", custom, 0o600) }, "/oem is a regular file, not a directory", true},
		{"no file", func(t *testing.T, n *testutil.Node) { mkdir(t, n.Path("/oem"), 0o755) }, "no cloud-config under /oem sets the cluster: section's config", true},
		{"no header: Kairos skips it", func(t *testing.T, n *testutil.Node) {
			n.Write("/oem/90_custom.yaml", strings.TrimPrefix(custom, "#cloud-config\n"), 0o600)
		}, "no cloud-config under /oem sets", true},
		{"not a .yaml: Kairos skips it", func(t *testing.T, n *testutil.Node) { n.Write("/oem/90_custom.yaml.bak", custom, 0o600) }, "no cloud-config under /oem sets", true},
		{"two files", func(t *testing.T, n *testutil.Node) {
			n.Write("/oem/90_custom.yaml", custom, 0o600)
			n.Write("/oem/sub/99_more.yml", custom, 0o600)
		}, "2 cloud-configs set the cluster: section's config (/oem/90_custom.yaml, /oem/sub/99_more.yml)", true},
		{"the key absent", func(t *testing.T, n *testutil.Node) {
			n.Write("/oem/90_custom.yaml", strings.Replace(custom, "kubernetesVersion: v1.36.3", "clusterName: c", 1), 0o600)
		}, "/oem/90_custom.yaml: clusterConfiguration.kubernetesVersion is not set", true},
		{"not YAML", func(t *testing.T, n *testutil.Node) {
			n.Write("/oem/90_custom.yaml", custom, 0o600)
			n.Write("/oem/95_broken.yaml", "#cloud-config\nusers: [\n", 0o600)
		}, "/oem/95_broken.yaml: not YAML", true},
		{"an alias", func(t *testing.T, n *testutil.Node) {
			n.Write("/oem/90_custom.yaml", strings.Replace(custom, "    clusterConfiguration:\n      kubernetesVersion: v1.36.3", "    v: &v v1.36.3\n    clusterConfiguration:\n      kubernetesVersion: *v", 1), 0o600)
		}, "/oem/90_custom.yaml: clusterConfiguration.kubernetesVersion is an alias", false},
		{"a symlinked file", func(t *testing.T, n *testutil.Node) {
			n.Write("/usr/local/custom.yaml", custom, 0o600)
			mkdir(t, n.Path("/oem"), 0o755)
			symlink(t, "../usr/local/custom.yaml", n.Path("/oem/90_custom.yaml"))
		}, "/oem/90_custom.yaml is a symlink: Kairos reads the file it points to", true},
		{"a FIFO", func(t *testing.T, n *testutil.Node) {
			n.Write("/oem/90_custom.yaml", custom, 0o600)
			testutil.Plant(t, n.Path("/oem/91_fifo.yaml"), testutil.FIFO)
		}, "/oem/91_fifo.yaml is a FIFO, not a regular file", true},
		{"a device", func(t *testing.T, n *testutil.Node) {
			n.Write("/oem/90_custom.yaml", custom, 0o600)
			testutil.Plant(t, n.Path("/oem/91_dev.yaml"), testutil.CharDev)
		}, "/oem/91_dev.yaml is a character device, not a regular file", true},
		{"oversize", func(t *testing.T, n *testutil.Node) {
			n.Write("/oem/90_custom.yaml", custom+"write_files:\n- content: |\n"+strings.Repeat("    "+strings.Repeat("x", 60)+"\n", 2<<20/64), 0o600)
		}, "/oem/90_custom.yaml is 2130146 bytes: Kairos skips a cloud-config of 2 MiB or more", true},
		{"too deep", func(t *testing.T, n *testutil.Node) {
			n.Write("/oem/90_custom.yaml", custom, 0o600)
			mkdir(t, n.Path("/oem/a/b/c/d/e/f/g/h/i"), 0o755)
		}, "/oem/a/b/c/d/e/f/g/h is nested more than 8 directories below /oem", true},
		{"too many YAML files", func(t *testing.T, n *testutil.Node) {
			n.Write("/oem/90_custom.yaml", custom, 0o600)
			for i := range 256 {
				n.Write(fmt.Sprintf("/oem/more/%03d.yml", i), "#cloud-config\n", 0o600)
			}
		}, "/oem holds more than 256 YAML files", true},
		{"too many entries", func(t *testing.T, n *testutil.Node) {
			n.Write("/oem/90_custom.yaml", custom, 0o600)
			for i := range 4096 {
				n.Write(fmt.Sprintf("/oem/notes/%04d.txt", i), "", 0o600)
			}
		}, "/oem holds more than 4096 entries", true},
		{"hard-linked", func(t *testing.T, n *testutil.Node) {
			n.Write("/oem/90_custom.yaml", custom, 0o600)
			if err := os.Link(n.Path("/oem/90_custom.yaml"), n.Path("/oem/copy")); err != nil {
				t.Fatal(err)
			}
		}, "/oem/90_custom.yaml has 2 hard links", false},
		{"owned by someone else", func(t *testing.T, n *testutil.Node) {
			n.Write("/oem/90_custom.yaml", custom, 0o600)
			chown(t, n.Path("/oem/90_custom.yaml"), 1000, 0)
		}, "/oem/90_custom.yaml is owned by uid 1000, not this user (uid 0)", false},
		{"group-writable", func(t *testing.T, n *testutil.Node) { writeMode(t, n, custom, 0o620) }, "/oem/90_custom.yaml is writable by its group or others (mode 0620)", false},
		{"world-writable", func(t *testing.T, n *testutil.Node) { writeMode(t, n, custom, 0o602) }, "(mode 0602)", false},
		{"setuid", func(t *testing.T, n *testutil.Node) { writeMode(t, n, custom, 0o600|os.ModeSetuid) }, "has setuid, setgid or sticky bits (mode 4600)", false},
		{"/oem writable by others", func(t *testing.T, n *testutil.Node) {
			n.Write("/oem/90_custom.yaml", custom, 0o600)
			if err := os.Chmod(n.Path("/oem"), 0o777); err != nil {
				t.Fatal(err)
			}
		}, "/oem can be written by another user", false},
		{"/oem someone else's", func(t *testing.T, n *testutil.Node) {
			n.Write("/oem/90_custom.yaml", custom, 0o600)
			chown(t, n.Path("/oem"), 1000, 1000)
		}, "/oem can be written by another user", false},
		{"a subdirectory writable by its group", func(t *testing.T, n *testutil.Node) {
			n.Write("/oem/sub/90_custom.yaml", custom, 0o600)
			if err := os.Chmod(n.Path("/oem/sub"), 0o775); err != nil {
				t.Fatal(err)
			}
		}, "/oem/sub can be written by another user", false},
		{"the root writable by others", func(t *testing.T, n *testutil.Node) {
			n.Write("/oem/90_custom.yaml", custom, 0o600)
			if err := os.Chmod(n.Root, 0o777); err != nil {
				t.Fatal(err)
			}
		}, "/ can be written by another user", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n := testutil.NewNode(t, "cp1")
			c.setup(t, n)
			before := testutil.Digest(t, n.Root)
			var ino uint64
			if fi, err := os.Lstat(n.Path("/oem/90_custom.yaml")); err == nil {
				ino = fi.Sys().(*syscall.Stat_t).Ino
			}
			start := time.Now()
			ch, err := Set(n.R(), version.MustParse("v1.37.2"), false)
			if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), c.why) || ch.Changed {
				t.Fatalf("got %+v %v, want a refusal saying %q", ch, err, c.why)
			}
			if took := time.Since(start); took > 5*time.Second {
				t.Fatalf("took %s", took)
			}
			if after := testutil.Digest(t, n.Root); after != before {
				t.Fatalf("a refusal changed the node:\n%s\nwas:\n%s", after, before)
			}
			if fi, err := os.Lstat(n.Path("/oem/90_custom.yaml")); err == nil && fi.Sys().(*syscall.Stat_t).Ino != ino {
				t.Fatal("a refusal replaced the file")
			}
			f, err := Find(n.R())
			f.Close()
			if c.show != (err != nil) || c.show && !strings.Contains(err.Error(), c.why) {
				t.Fatalf("pin show: %v", err)
			}
			if err != nil && strings.Contains(err.Error(), "Zq8-r4Nd0m") {
				t.Fatal("a refusal carries the cluster token")
			}
		})
	}
}

// The file is found as Kairos finds cloud-configs: below /oem, in a
// subdirectory too, *.yml as well as *.yaml, any of Kairos's headers in
// its first ten lines; a file under /oem that Kairos skips is not read.
func TestFindAsKairos(t *testing.T) {
	for _, c := range []struct{ file, text string }{
		{"/oem/90_custom.yaml", custom},
		{"/oem/nested/dir/cc.yml", custom},
		{"/oem/k.yaml", strings.Replace(custom, "#cloud-config", "# comment\n\n#kairos-config  ", 1)},
		{"/oem/n.yaml", strings.Replace(custom, "#cloud-config", "#node-config", 1)},
	} {
		n := testutil.NewNode(t, "cp1")
		n.Write(c.file, c.text, 0o600)
		n.Write("/oem/80_other.yaml", "#cloud-config\nhostname: x\n", 0o600)
		n.Write("/oem/85_headerless.yaml", "\n\n\n\n\n\n\n\n\n\n#cloud-config\n"+custom, 0o600) // header past line ten
		n.Write("/oem/89_custom.yaml.orig", custom, 0o600)
		f, err := Find(n.R())
		if err != nil || f.Path != c.file || f.Pin != "v1.36.3" {
			t.Fatalf("%s: %+v %v", c.file, f, err)
		}
		f.Close()
	}
}

// Set replaces the file atomically (a new inode, nothing left beside it)
// with its owner, group and mode, the rest of it byte-identical; at the pin
// already, or in a dry run, it writes nothing.
func TestSetKeepsTheFile(t *testing.T) {
	testutil.RequireRoot(t) // a group other than root's
	n := testutil.NewNode(t, "cp1")
	for _, l := range layouts {
		writeMode(t, n, strings.ReplaceAll(l.text, "%[1]s", "v1.36.3"), 0o640)
		p := n.Path("/oem/90_custom.yaml")
		chown(t, p, 0, 4)
		st0 := stat(t, p)

		ch, err := Set(n.R(), version.MustParse("v1.37.2"), true)
		if err != nil || ch.Changed || !strings.Contains(ch.Diff, "+") || stat(t, p).Ino != st0.Ino {
			t.Fatalf("%s: dry run %+v %v", l.name, ch, err)
		}
		ch, err = Set(n.R(), version.MustParse("v1.37.2"), false)
		if err != nil || !ch.Changed || ch.From != "v1.36.3" || ch.Path != "/oem/90_custom.yaml" {
			t.Fatalf("%s: %+v %v", l.name, ch, err)
		}
		if got, want := n.Read("/oem/90_custom.yaml"), strings.ReplaceAll(l.text, "%[1]s", "v1.37.2"); got != want {
			t.Fatalf("%s:\n%q\nwant\n%q", l.name, got, want)
		}
		st := stat(t, p)
		if st.Ino == st0.Ino || st.Mode != st0.Mode || st.Uid != 0 || st.Gid != 4 || st.Nlink != 1 {
			t.Fatalf("%s: replaced as %+v, was %+v", l.name, st, st0)
		}
		if ents, _ := os.ReadDir(n.Path("/oem")); len(ents) != 1 {
			t.Fatalf("%s: /oem holds %v", l.name, ents)
		}
		ch, err = Set(n.R(), version.MustParse("v1.37.2"), false)
		if err != nil || ch.Changed || stat(t, p).Ino != st.Ino {
			t.Fatalf("%s: at the pin already: %+v %v", l.name, ch, err)
		}
	}
}

// The dry run's diff is the one line, the old value described when it is
// not a version.
func TestSetDryRunDiff(t *testing.T) {
	n := testutil.NewNode(t, "cp1")
	n.Write("/oem/90_custom.yaml", strings.Replace(custom, "v1.36.3", "\"v1.36.3\" # pinned", 1), 0o600)
	ch, err := Set(n.R(), version.MustParse("v1.37.2"), true)
	want := "--- /oem/90_custom.yaml\n+++ /oem/90_custom.yaml\n@@ -9 +9 @@\n-      kubernetesVersion: \"v1.36.3\" # pinned\n+      kubernetesVersion: \"v1.37.2\" # pinned\n"
	if err != nil || ch.Diff != want {
		t.Fatalf("%v\n%s", err, ch.Diff)
	}
	n.Write("/oem/90_custom.yaml", strings.Replace(custom, "v1.36.3", "Zq8-r4Nd0m-cluster-T0ken-9f3a", 1), 0o600)
	ch, err = Set(n.R(), version.MustParse("v1.37.2"), true)
	if err != nil || !strings.Contains(ch.Diff, "-      kubernetesVersion: <a value of 29 characters, not shown>\n") || strings.Contains(ch.Diff, "Zq8") {
		t.Fatalf("%v\n%s", err, ch.Diff)
	}
}

// A file changed between pin's read and its write is not overwritten; nor
// is one another pin set is writing.
func TestSetRefusesAConcurrentChange(t *testing.T) {
	n := testutil.NewNode(t, "cp1")
	n.Write("/oem/90_custom.yaml", custom, 0o600)
	f, err := Find(n.R())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	edited := strings.Replace(custom, "hostname: cp1", "hostname: cp9", 1)
	n.Write("/oem/90_custom.yaml", edited, 0o600)
	if _, err := f.set(version.MustParse("v1.37.2"), false); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "/oem/90_custom.yaml changed while pin was reading it") {
		t.Fatalf("%v", err)
	}
	if got := n.Read("/oem/90_custom.yaml"); got != edited {
		t.Fatalf("the operator's edit was lost:\n%s", got)
	}

	held, err := os.Open(n.Path("/oem"))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if err := unix.Flock(int(held.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	if _, err := Set(n.R(), version.MustParse("v1.37.2"), false); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "another pin set is writing in /oem") {
		t.Fatalf("%v", err)
	}
	if got := n.Read("/oem/90_custom.yaml"); got != edited {
		t.Fatalf("written while locked:\n%s", got)
	}
}

// writeMode writes /oem/90_custom.yaml with exactly mode (the umask aside).
func writeMode(t *testing.T, n *testutil.Node, text string, mode os.FileMode) {
	t.Helper()
	n.Write("/oem/90_custom.yaml", text, 0o600)
	if err := os.Chmod(n.Path("/oem/90_custom.yaml"), mode); err != nil {
		t.Fatal(err)
	}
}

func symlink(t *testing.T, target, p string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, p); err != nil {
		t.Fatal(err)
	}
}

func mkdir(t *testing.T, p string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(p, mode); err != nil {
		t.Fatal(err)
	}
}

func chown(t *testing.T, p string, uid, gid int) {
	t.Helper()
	if err := os.Lchown(p, uid, gid); err != nil {
		t.Fatal(err)
	}
}

func stat(t *testing.T, p string) *syscall.Stat_t {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t)
}

// kairosAccounts writes what kairos-init's 10_accounting.yaml leaves on
// every boot of a real Kairos node: the admin group (gid 900) with sudo
// for everything, and /oem root:admin 0770 with its files root:admin
// (the install wrote 90_custom.yaml 0640). sudoLine is the sudoers line
// for admin ("" for none).
func kairosAccounts(t *testing.T, n *testutil.Node, sudoLine string) {
	t.Helper()
	n.Write("/etc/group", "root:x:0:\nsudo:x:27:\nadmin:x:900:kairos\n", 0o644)
	n.Write("/etc/sudoers", "Defaults env_reset\nroot ALL=(ALL) ALL\n"+sudoLine+"\n#includedir /etc/sudoers.d\n", 0o600)
	writeMode(t, n, custom, 0o640)
	chown(t, n.Path("/oem/90_custom.yaml"), 0, 900)
	chown(t, n.Path("/oem"), 0, 900)
	if err := os.Chmod(n.Path("/oem"), 0o770); err != nil {
		t.Fatal(err)
	}
}

// On a real Kairos node /oem is root:admin 0770 (what the Kairos VM test
// found: pin set refused every real node). admin's members are root by
// sudo, so a directory only they and root can write is trusted, and the
// file keeps its owner, group and mode. A group without that sudo line,
// or world write, is still refused.
func TestSetOnKairosOEM(t *testing.T) {
	testutil.RequireRoot(t) // root:admin
	for _, sudo := range []string{"%admin ALL=(ALL) NOPASSWD: ALL", "%admin  ALL = (ALL:ALL) ALL"} {
		n := testutil.NewNode(t, "cp1")
		kairosAccounts(t, n, sudo)
		ch, err := Set(n.R(), version.MustParse("v1.37.2"), false)
		if err != nil || !ch.Changed || ch.Path != "/oem/90_custom.yaml" {
			t.Fatalf("%q: %+v %v", sudo, ch, err)
		}
		if st := stat(t, n.Path("/oem/90_custom.yaml")); st.Uid != 0 || st.Gid != 900 || st.Mode&0o7777 != 0o640 {
			t.Fatalf("%q: replaced as uid %d gid %d mode %04o", sudo, st.Uid, st.Gid, st.Mode&0o7777)
		}
	}
	for name, setup := range map[string]func(n *testutil.Node){
		"admin may not sudo everything": func(n *testutil.Node) { kairosAccounts(t, n, "%admin ALL=(ALL) /usr/bin/systemctl") },
		"no sudo line":                  func(n *testutil.Node) { kairosAccounts(t, n, "") },
		"the line commented out":        func(n *testutil.Node) { kairosAccounts(t, n, "# %admin ALL=(ALL) NOPASSWD: ALL") },
		"all but one command":           func(n *testutil.Node) { kairosAccounts(t, n, "%admin ALL=(ALL) ALL, !/usr/bin/su") },
		"sudoers writable by its group": func(n *testutil.Node) {
			kairosAccounts(t, n, "%admin ALL=(ALL) NOPASSWD: ALL")
			if err := os.Chmod(n.Path("/etc/sudoers"), 0o660); err != nil {
				t.Fatal(err)
			}
		},
		"/oem world-writable too": func(n *testutil.Node) {
			kairosAccounts(t, n, "%admin ALL=(ALL) NOPASSWD: ALL")
			if err := os.Chmod(n.Path("/oem"), 0o777); err != nil {
				t.Fatal(err)
			}
		},
	} {
		n := testutil.NewNode(t, "cp1")
		setup(n)
		before := testutil.Digest(t, n.Root)
		_, err := Set(n.R(), version.MustParse("v1.37.2"), false)
		if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "/oem can be written by another user") {
			t.Fatalf("%s: %v", name, err)
		}
		if after := testutil.Digest(t, n.Root); after != before {
			t.Fatalf("%s: the tree changed on a refusal", name)
		}
	}
}
