// This test runs the real Kairos client against the built provider,
// without nodes: kairos-agent v2.31.4 (built from its module) sends
// agent.boot to /system/providers/agent-provider-kubernetes and runs the
// boot stage, in a chroot on tmpfs inside a private mount namespace, so
// nothing on the host changes. The end-to-end suite (tests/e2e) runs the
// same chain on booted nodes.
package kairos_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	yaml3 "gopkg.in/yaml.v3"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/testbin"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
	"github.com/kairos-io/provider-kubernetes/internal/testutil/docs"
	"github.com/kairos-io/provider-kubernetes/internal/testutil/kairos"
	"github.com/kairos-io/provider-kubernetes/pkg/clusterconfig"
)

// childEnv makes the test binary the child that sets up the chroot in its
// own mount namespace (created by the parent with CLONE_NEWNS).
const (
	childEnv    = "PROVIDER_KUBERNETES_KAIROS_CHAIN_DIR"
	agentEnv    = "PROVIDER_KUBERNETES_KAIROS_AGENT"
	providerEnv = "PROVIDER_KUBERNETES_KAIROS_PROVIDER"
)

func TestRealKairosAgentChain(t *testing.T) {
	if dir := os.Getenv(childEnv); dir != "" {
		chainChild(t, dir)
		return
	}
	testutil.RequireRoot(t)
	if testing.Short() {
		t.Skip("builds the real kairos-agent: not in -short mode")
	}
	agent := kairosAgent(t)
	prov := testbin.Provider(t)
	dir := t.TempDir()
	cmd := testutil.Command(t, 10*time.Minute, os.Args[0], "-test.run=^TestRealKairosAgentChain$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"="+dir, agentEnv+"="+agent, providerEnv+"="+prov)
	// Go makes / private (recursively) in the child's new mount namespace:
	// its mounts never reach the host.
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestRealKairosAgentChain") {
		t.Fatalf("child: %v\n%s", err, out)
	}
	t.Logf("child:\n%s", out)
}

func kairosAgent(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Minute)
	defer cancel()
	p, err := testbin.KairosAgent(ctx, testLog{t})
	if err != nil {
		t.Fatalf("build kairos-agent: %v", err)
	}
	return p
}

type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Logf("%s", bytes.TrimRight(p, "\n"))
	return len(p), nil
}

// chroot is the Kairos root the child built: tmpfs, with the host's /usr
// and /etc read-only, /usr/local, /oem, /system and /run its own.
type chroot struct {
	t     *testing.T
	root  string
	pages map[string]*docs.Page // opened by doc: what each page's commands ran
}

func (c *chroot) path(p string) string { return filepath.Join(c.root, p) }

func (c *chroot) read(p string) []byte {
	c.t.Helper()
	b, err := os.ReadFile(c.path(p))
	if err != nil {
		c.t.Fatal(err)
	}
	return b
}

func (c *chroot) write(p string, data []byte, mode os.FileMode) {
	c.t.Helper()
	if err := os.MkdirAll(filepath.Dir(c.path(p)), 0o755); err != nil {
		c.t.Fatal(err)
	}
	if err := os.WriteFile(c.path(p), data, mode); err != nil {
		c.t.Fatal(err)
	}
}

// run runs a command chrooted into the Kairos root with a closed
// environment; it returns the combined output and the exit code.
func (c *chroot) run(args ...string) (string, int) {
	c.t.Helper()
	// The path is resolved inside the chroot, so give it absolute.
	return c.exec("/usr/local/bin/"+args[0], args[1:]...)
}

// doc runs the command of docs/page that starts with prefix, from the
// page's own text, with sh in the chroot.
func (c *chroot) doc(page, prefix string) (string, int) {
	c.t.Helper()
	p := c.pages[page]
	if p == nil {
		var err error
		if p, err = docs.Open(page); err != nil {
			c.t.Fatal(err)
		}
		c.pages[page] = p
	}
	line, err := p.Command(prefix)
	if err != nil {
		c.t.Fatal(err)
	}
	return c.exec("/usr/bin/sh", "-c", line)
}

func (c *chroot) exec(path string, args ...string) (string, int) {
	c.t.Helper()
	cmd := testutil.Command(c.t, 2*time.Minute, path, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: c.root}
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/sbin:/usr/bin", "HOME=/root", "TERM=dumb", "BUS_DEBUG=true"}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	code := cmd.ProcessState.ExitCode()
	if err != nil && code < 0 {
		c.t.Fatalf("%v: %v\n%s", args, err, out.String())
	}
	return out.String(), code
}

func mount(t *testing.T, src, dst, fstype string, flags uintptr, data string) {
	t.Helper()
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(src, dst, fstype, flags, data); err != nil {
		t.Fatalf("mount %s on %s: %v", src, dst, err)
	}
}

func bindRO(t *testing.T, src, dst string) {
	t.Helper()
	mount(t, src, dst, "", unix.MS_BIND|unix.MS_REC, "")
	if err := unix.Mount("", dst, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		t.Fatalf("remount %s read-only: %v", dst, err)
	}
}

func newChroot(t *testing.T, dir string) *chroot {
	c := &chroot{t: t, root: filepath.Join(dir, "root"), pages: map[string]*docs.Page{}}
	// This test is cloud-config.md's (tests/docs pageTests): every local
	// command the page shows is run here.
	t.Cleanup(func() {
		switch p := c.pages["cloud-config.md"]; {
		case t.Failed():
		case p == nil:
			t.Error("docs/cloud-config.md: none of its commands ran")
		case len(p.Unrun()) > 0:
			t.Errorf("docs/cloud-config.md shows commands this test does not run: %q", p.Unrun())
		}
	})
	mount(t, "tmpfs", c.root, "tmpfs", 0, "mode=0755")
	for _, d := range []string{"proc", "sys", "dev", "run", "tmp", "oem", "var/log", "root", "system/providers", "system/oem"} {
		if err := os.MkdirAll(c.path(d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(c.path("tmp"), 0o1777); err != nil {
		t.Fatal(err)
	}
	for _, l := range []string{"bin", "sbin", "lib", "lib64"} {
		if err := os.Symlink("usr/"+l, c.path(l)); err != nil {
			t.Fatal(err)
		}
	}
	bindRO(t, "/usr", c.path("usr"))
	mount(t, "tmpfs", c.path("usr/local"), "tmpfs", 0, "mode=0755")
	bindRO(t, "/etc", c.path("etc"))
	bindRO(t, "/sys", c.path("sys"))
	mount(t, "/dev", c.path("dev"), "", unix.MS_BIND|unix.MS_REC, "")
	mount(t, "proc", c.path("proc"), "proc", 0, "")
	for _, d := range []string{"usr/local/bin", "usr/local/cloud-config"} {
		if err := os.MkdirAll(c.path(d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// The real agent (on /usr/local/bin: the host's /usr is read-only here),
	// the provider where Kairos finds plugins, kairos-init's notify stage.
	testutil.CopyFile(t, os.Getenv(agentEnv), c.path("usr/local/bin/kairos-agent"), 0o755)
	testutil.CopyFile(t, os.Getenv(providerEnv), c.path(paths.ProviderPlugin), 0o755)
	if err := os.Symlink(paths.ProviderPlugin, c.path("usr/local/bin/provider-kubernetes")); err != nil {
		t.Fatal(err)
	}
	c.write(kairos.NotifyStageFile, []byte(kairos.NotifyStage), 0o644)
	// No systemd in a chroot: the boot stage's `systemctl start` is recorded.
	c.write("usr/local/bin/systemctl", []byte("#!/bin/sh\necho \"$*\" >> /run/systemctl.log\n"), 0o755)
	return c
}

const chainToken = "Zq8-r4Nd0m-cluster-T0ken-9f3a"

// section is a cluster: section as an operator writes it in /oem.
func section(role, pin string) string {
	return fmt.Sprintf(`cluster:
  cluster_token: %s
  control_plane_host: 10.0.0.11
  role: %s
  config: |
    clusterConfiguration:
      kubernetesVersion: %s
    initConfiguration:
      nodeRegistration:
        name: cp1
  providerConfig:
    budget.verify: 6m
`, chainToken, role, pin)
}

func cloudConfig(extra string) []byte {
	return []byte("#cloud-config\n# the operator's cloud-config (tests/kairos)\n" + extra)
}

func noSecret(t *testing.T, what, s string) {
	t.Helper()
	if strings.Contains(s, chainToken) {
		t.Fatalf("%s carries the cluster token:\n%s", what, s)
	}
}

// yipFile checks the plugin's output (0600 root, #cloud-config) and returns it.
func (c *chroot) yipFile() []byte {
	c.t.Helper()
	st, err := os.Lstat(c.path(paths.ClusterYipFile))
	if err != nil {
		c.t.Fatalf("the plugin wrote no %s: %v", paths.ClusterYipFile, err)
	}
	sys := st.Sys().(*syscall.Stat_t)
	if !st.Mode().IsRegular() || st.Mode().Perm() != 0o600 || sys.Uid != 0 || sys.Gid != 0 {
		c.t.Fatalf("%s: %v uid %d gid %d, want a regular 0600 root:root file", paths.ClusterYipFile, st.Mode(), sys.Uid, sys.Gid)
	}
	b := c.read(paths.ClusterYipFile)
	if !bytes.HasPrefix(b, []byte("#cloud-config\n")) {
		c.t.Fatalf("no #cloud-config header:\n%s", b)
	}
	return b
}

func chainChild(t *testing.T, dir string) {
	c := newChroot(t, dir)
	want := func(cc []byte) *clusterconfig.Cluster {
		t.Helper()
		w, _, err := clusterconfig.ParseCloudConfig(cc)
		if err != nil || w == nil {
			t.Fatalf("the test's cloud-config: %v", err)
		}
		return w
	}

	// The whole chain as a Kairos boot runs it: the initramfs stage of
	// /system/oem (kairos-init's notify file) sends agent.boot with the
	// merged /oem cloud-config; the boot stage runs the plugin's yip config.
	good := cloudConfig(section("init", "v1.37.2"))
	c.write(kairos.OEMCloudConfig, good, 0o600)
	out, code := c.run("kairos-agent", "run-stage", "initramfs")
	noSecret(t, "kairos-agent run-stage initramfs", out)
	if code != 0 {
		t.Fatalf("run-stage initramfs: exit %d\n%s", code, out)
	}
	c.yipFile()
	out, code = c.run("kairos-agent", "run-stage", "boot")
	noSecret(t, "kairos-agent run-stage boot", out)
	if code != 0 {
		t.Fatalf("run-stage boot: exit %d\n%s", code, out)
	}
	st, err := os.Lstat(c.path(paths.ClusterFile))
	if err != nil || !st.Mode().IsRegular() || st.Mode().Perm() != 0o600 {
		t.Fatalf("the boot stage's cluster file: %v %v\n%s", st, err, out)
	}
	got, err := clusterconfig.Parse(c.read(paths.ClusterFile))
	if err != nil {
		t.Fatal(err)
	}
	if w := want(good); fmt.Sprint(*got) != fmt.Sprint(*w) {
		t.Fatalf("cluster file %+v\nwant %+v", got, w)
	}
	if log := string(c.read("/run/systemctl.log")); log != "start --no-block "+paths.ReconcileUnit+"\n" {
		t.Fatalf("the boot stage ran systemctl %q", log)
	}
	if out, code := c.doc("cloud-config.md", "stat "); code != 0 || out != "600 root "+paths.ClusterYipFile+"\n" {
		t.Fatalf("docs/cloud-config.md's stat: exit %d %q", code, out)
	}
	t.Logf("initramfs + boot stage: the plugin wrote %s, the boot stage the cluster file and one systemctl start", paths.ClusterYipFile)

	// Over 8 KiB: kairos-agent hands the data over in a file.
	big := cloudConfig(section("init", "v1.36.3") + "write_files:\n- path: /etc/motd\n  content: |\n" +
		strings.Repeat("    a line of a large cloud-config that pushes the payload over eight KiB\n", 200))
	c.write(kairos.OEMCloudConfig, big, 0o600)
	out, code = c.doc("cloud-config.md", "kairos-agent notify agent.boot")
	noSecret(t, "kairos-agent notify (over 8 KiB)", out)
	if code != 0 || !strings.Contains(out, "cluster section valid (role init") {
		t.Fatalf("notify over 8 KiB: exit %d\n%s", code, out)
	}
	if !bytes.Contains(c.yipFile(), []byte("kubernetesVersion: v1.36.3")) {
		t.Fatalf("the section over 8 KiB was not written:\n%s", c.read(paths.ClusterYipFile))
	}

	// A bad section: kairos-agent exits non-zero with the plugin's one
	// error, and the previous config is byte-identical.
	before := c.yipFile()
	for name, bad := range map[string]string{
		"unknown role":                strings.Replace(section("init", "v1.37.2"), "role: init", "role: master", 1),
		"nested providerConfig":       strings.Replace(section("init", "v1.37.2"), "    budget.verify: 6m", "    budgets:\n      verify: 6m", 1),
		"a secret as a budget value":  strings.Replace(section("init", "v1.37.2"), "budget.verify: 6m", "budget.verify: "+chainToken, 1),
		"config as a map, not string": strings.Replace(section("init", "v1.37.2"), "config: |", "config:", 1),
	} {
		c.write(kairos.OEMCloudConfig, cloudConfig(bad), 0o600)
		out, code = c.doc("cloud-config.md", "kairos-agent notify agent.boot")
		noSecret(t, "kairos-agent notify ("+name+")", out)
		if code == 0 || !strings.Contains(out, "Provider kubernetes at /system/providers/agent-provider-kubernetes had an error: agent.boot: ") {
			t.Fatalf("%s: exit %d\n%s", name, code, out)
		}
		if after := c.read(paths.ClusterYipFile); !bytes.Equal(after, before) {
			t.Fatalf("%s: the previous %s changed", name, paths.ClusterYipFile)
		}
		// Recorded for the reconcile pass, which then refuses.
		if rec := string(c.read(paths.PluginError)); !strings.Contains(out, strings.TrimSpace(rec)) || !strings.HasPrefix(rec, "agent.boot: ") {
			t.Fatalf("%s: %s holds %q", name, paths.PluginError, rec)
		}
		t.Logf("%s: kairos-agent exit %d: %s", name, code, lastLine(out, "had an error"))
	}

	// The example cloud-configs an operator copies, filled in, through the
	// real agent and plugin; the first accepted section clears the bad
	// ones' record.
	for role, ex := range examples(t) {
		c.write(kairos.OEMCloudConfig, fill(ex), 0o600)
		out, code := c.run("kairos-agent", "notify", "agent.boot")
		noSecret(t, "kairos-agent notify (example "+role+")", out)
		if code != 0 || !strings.Contains(out, "cluster section valid (role "+role) {
			t.Fatalf("example %s: exit %d\n%s", role, code, out)
		}
		got, err := clusterconfig.Parse(sectionOf(t, c.yipFile()))
		if err != nil || got.Role != role {
			t.Fatalf("example %s: the plugin wrote %+v %v", role, got, err)
		}
		if _, err := os.Lstat(c.path(paths.PluginError)); !os.IsNotExist(err) {
			t.Fatalf("example %s: an accepted section left %s: %v", role, paths.PluginError, err)
		}
	}

	// The pin bump of docs/upgrade.md (cloud-config.md links there), from
	// 1.36.3 to 1.37.2, is an edit of the pin alone that the real agent
	// and plugin then accept.
	c.write(kairos.OEMCloudConfig, cloudConfig(section("init", "v1.36.3")), 0o600)
	if out, code := c.doc("upgrade.md", "provider-kubernetes pin set"); code != 0 {
		t.Fatalf("docs/upgrade.md's pin set: exit %d %s", code, out)
	}
	if want := cloudConfig(section("init", "v1.37.2")); !bytes.Equal(c.read(kairos.OEMCloudConfig), want) {
		t.Fatalf("the documented pin bump left:\n%s", c.read(kairos.OEMCloudConfig))
	}
	if out, code := c.doc("cloud-config.md", "kairos-agent notify agent.boot"); code != 0 || !bytes.Contains(c.yipFile(), []byte("kubernetesVersion: v1.37.2")) {
		t.Fatalf("after the pin bump: exit %d\n%s", code, out)
	}
	if _, err := os.Lstat(c.path(paths.PluginError)); !os.IsNotExist(err) {
		t.Fatalf("an accepted section left %s: %v", paths.PluginError, err)
	}

	// Kairos's reset events reach the provider, which changes nothing (a
	// `kairos-agent reset` wipes the persistent state itself); the SDK's
	// cluster.reset is not an event this kairos-agent knows.
	c.write(kairos.OEMCloudConfig, good, 0o600)
	if _, code := c.run("kairos-agent", "notify", "agent.boot"); code != 0 {
		t.Fatal("notify agent.boot")
	}
	inv := inventory(t, c.root)
	for _, ev := range []string{"agent.reset.before", "agent.reset.after"} {
		out, code := c.run("kairos-agent", "notify", ev)
		if code != 0 {
			t.Fatalf("notify %s: exit %d\n%s", ev, code, out)
		}
		if now := inventory(t, c.root); now != inv {
			t.Fatalf("notify %s changed files", ev)
		}
	}
	out, code = c.run("kairos-agent", "notify", "cluster.reset")
	if code == 0 || !strings.Contains(out, "event 'cluster.reset' not defined") {
		t.Fatalf("notify cluster.reset: exit %d\n%s", code, out)
	}

	// The cluster: section removed: the plugin removes its yip config, so
	// the boot stage writes no cluster file and starts nothing.
	c.write(kairos.OEMCloudConfig, cloudConfig(""), 0o600)
	if err := os.Remove(c.path(paths.ClusterFile)); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(c.path("/run/systemctl.log")); err != nil {
		t.Fatal(err)
	}
	if out, code := c.run("kairos-agent", "run-stage", "initramfs"); code != 0 {
		t.Fatalf("run-stage initramfs without a section: exit %d\n%s", code, out)
	}
	if _, err := os.Lstat(c.path(paths.ClusterYipFile)); !os.IsNotExist(err) {
		t.Fatalf("%s survived the section's removal: %v", paths.ClusterYipFile, err)
	}
	if out, code := c.run("kairos-agent", "run-stage", "boot"); code != 0 {
		t.Fatalf("run-stage boot without a section: exit %d\n%s", code, out)
	}
	for _, p := range []string{paths.ClusterFile, "/run/systemctl.log"} {
		if _, err := os.Lstat(c.path(p)); !os.IsNotExist(err) {
			t.Fatalf("without a cluster: section, %s exists: %v", p, err)
		}
	}

	beforeUpgradeIsNotAGate(t, c)
}

// docs/fleet-upgrade.md, "Why not a before-upgrade stage": kairos-agent
// runs a failing stage and goes on. `kairos-agent upgrade` runs its
// before-upgrade hook through the same run of the stage (pkg/utils
// RunStage, whose errors it drops unless strict, as the hook itself does:
// pkg/action/common.go Hook); the upgrade needs the real partitions and
// cannot run here, so the stage is run as `run-stage` runs it: the stage's
// command ran and failed, the agent exits 0; only --strict makes it fail.
func beforeUpgradeIsNotAGate(t *testing.T, c *chroot) {
	c.write(kairos.OEMCloudConfig, cloudConfig("stages:\n  before-upgrade:\n  - name: a refusing check\n    commands:\n    - echo ran > /run/before-upgrade-ran\n    - exit 3\n"), 0o600)
	out, code := c.run("kairos-agent", "run-stage", "before-upgrade")
	if code != 0 || !strings.Contains(out, "Some errors found but were ignored") {
		t.Fatalf("a failing before-upgrade stage: exit %d\n%s", code, out)
	}
	if got := string(c.read("/run/before-upgrade-ran")); got != "ran\n" {
		t.Fatalf("the stage's command did not run: %q", got)
	}
	out, code = c.run("kairos-agent", "run-stage", "--strict", "before-upgrade")
	if code == 0 {
		t.Fatalf("with --strict the failing stage: exit 0\n%s", out)
	}
	t.Logf("a failing before-upgrade stage: exit 0 (errors ignored); with --strict: exit %d", code)
}

func lastLine(s, containing string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, containing) {
			return l
		}
	}
	return ""
}

// inventory lists every file under root with its size and mode, skipping
// the mounts (proc, sys, dev, usr, etc) and kairos-agent's own logs.
func inventory(t *testing.T, root string) string {
	t.Helper()
	var b strings.Builder
	for _, d := range []string{"oem", "run", "system", "usr/local", "root", "tmp"} {
		_ = filepath.Walk(filepath.Join(root, d), func(p string, fi os.FileInfo, err error) error {
			if err == nil {
				fmt.Fprintf(&b, "%s %v %d\n", p, fi.Mode(), fi.Size())
			}
			return nil
		})
	}
	return b.String()
}

// sectionOf is the cluster section the plugin's yip config writes.
func sectionOf(t *testing.T, yipConfig []byte) []byte {
	t.Helper()
	var y struct {
		Stages map[string][]struct {
			Files []struct {
				Path    string `yaml:"path"`
				Content string `yaml:"content"`
			} `yaml:"files"`
		} `yaml:"stages"`
	}
	if err := yaml3.Unmarshal(yipConfig, &y); err != nil {
		t.Fatal(err)
	}
	for _, st := range y.Stages["boot"] {
		for _, f := range st.Files {
			if f.Path == paths.ClusterFile {
				return []byte(f.Content)
			}
		}
	}
	t.Fatalf("no %s in the yip config", paths.ClusterFile)
	return nil
}
