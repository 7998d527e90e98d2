package harness

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/kairos-io/provider-kubernetes/internal/testutil"
	"github.com/kairos-io/provider-kubernetes/internal/testutil/kairos"
)

// This host's layout (cgroup v1 hybrid, the test process in a nested memory cgroup).
const hostMountinfo = `23 1 254:0 / / rw,relatime - ext4 /dev/vda rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime shared:9 - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
50 23 0:32 / /mnt/memory\040again rw,relatime - cgroup cgroup rw,memory
`

const hostCgroup = `9:name=systemd:/
4:memory:/process_api/e30f
3:cpuset:/
1:cpu:/
0::/
`

func TestParseHierarchies(t *testing.T) {
	hs, err := parseHierarchies(hostMountinfo, hostCgroup)
	if err != nil {
		t.Fatal(err)
	}
	want := []hierarchy{
		{Mount: "/sys/fs/cgroup/cpu", Parent: "/", Names: []string{"cpu"}},
		{Mount: "/sys/fs/cgroup/cpuset", Parent: "/", Names: []string{"cpuset"}},
		{Mount: "/sys/fs/cgroup/memory", Parent: "/process_api/e30f", Names: []string{"memory"}},
		{Mount: "/sys/fs/cgroup/systemd", Parent: "/", Names: []string{"name=systemd"}},
		{Mount: "/sys/fs/cgroup/unified", Parent: "/", V2: true},
	}
	if !reflect.DeepEqual(hs, want) {
		t.Fatalf("got %+v\nwant %+v", hs, want)
	}
	if d := hs[2].Dir("pk-e2e-x-n1"); d != "/sys/fs/cgroup/memory/process_api/e30f/pk-e2e-x-n1" {
		t.Errorf("node dir %s", d)
	}
}

func TestParseHierarchiesCombinedAndSubtreeMounts(t *testing.T) {
	mi := `30 20 0:30 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
31 20 0:31 /lxc/box /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids
32 20 0:32 /other /sys/fs/cgroup/blkio rw - cgroup cgroup rw,blkio
`
	cg := "5:cpu,cpuacct:/a/b\n4:pids:/lxc/box/inner\n3:blkio:/lxc/box\n"
	hs, err := parseHierarchies(mi, cg)
	if err != nil {
		t.Fatal(err)
	}
	want := []hierarchy{
		{Mount: "/sys/fs/cgroup/cpu,cpuacct", Parent: "/a/b", Names: []string{"cpu", "cpuacct"}},
		// The mount shows /lxc/box as its root: our path is relative to it.
		{Mount: "/sys/fs/cgroup/pids", Parent: "/inner", Names: []string{"pids"}},
		// blkio is mounted at a subtree this process is not in: unusable, left out.
	}
	if !reflect.DeepEqual(hs, want) {
		t.Fatalf("got %+v\nwant %+v", hs, want)
	}
	if _, err := parseHierarchies("", cg); err == nil {
		t.Error("no hierarchy mounted: want an error")
	}
}

func TestParseProcStat(t *testing.T) {
	// comm may hold spaces and parentheses.
	st, err := parseProcStat("4242 (sd (pam) x) S 17 4242 4242 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 987654 1000 10 18446744073709551615")
	if err != nil {
		t.Fatal(err)
	}
	if st.Comm != "sd (pam) x" || st.PPID != 17 || st.Start != 987654 {
		t.Errorf("%+v", st)
	}
	if _, err := parseProcStat("garbage"); err == nil {
		t.Error("garbage: want an error")
	}
	me, err := readProcStat(os.Getpid())
	if err != nil || me.PPID != os.Getppid() {
		t.Errorf("own stat %+v %v", me, err)
	}
	if !alive(self()) || alive(holder{PID: os.Getpid(), Start: self().Start + 1}) {
		t.Error("alive must match the PID and its start time")
	}
}

func TestOverlayOptions(t *testing.T) {
	got, err := overlayOptions([]string{"/t/tree", "/c/config", "/c/rootfs"}, "/s/n1/upper", "/s/n1/work")
	if err != nil {
		t.Fatal(err)
	}
	// The OS tree is the topmost lower: its files win over the base's.
	want := "lowerdir=/t/tree:/c/config:/c/rootfs,upperdir=/s/n1/upper,workdir=/s/n1/work,index=off,redirect_dir=off"
	if got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	for _, bad := range []string{"/t/a,b", "/t/a:b", `/t/a\b`, "relative"} {
		if _, err := overlayOptions([]string{bad, "/c/rootfs"}, "/u", "/w"); err == nil {
			t.Errorf("%q: want a refusal", bad)
		}
	}
}

func TestBootArgv(t *testing.T) {
	s := bootSpec{
		Unshare: "/usr/bin/unshare", Mount: "/usr/bin/mount", Nspawn: "/usr/bin/systemd-nspawn",
		Procs:   []string{"/sys/fs/cgroup/cpu/pk-e2e-c-n1/cgroup.procs", "/sys/fs/cgroup/unified/pk-e2e-c-n1/cgroup.procs"},
		Overlay: "lowerdir=/a:/b,upperdir=/u,workdir=/w", Root: "/s/n1/root", Machine: "c-n1", Hostname: "n1",
		NetNS: "c-n1", Containerd: "/s/n1/containerd", Binds: []Bind{{Host: "/img", Node: "/images", ReadOnly: true}},
	}
	a := bootArgv(s)
	// Private mount namespace, then the script: cgroups, then mount, then nspawn.
	if !slices.Equal(a[:4], []string{"--mount", "--propagation", "private", "--"}) || a[4] != "/bin/sh" || a[6] != bootScript {
		t.Fatalf("prefix %q", a[:7])
	}
	i := slices.Index(a, "--")
	j := slices.Index(a[i+1:], "--") + i + 1
	if !slices.Equal(a[8:j], s.Procs) {
		t.Errorf("cgroup procs %q", a[8:j])
	}
	if !slices.Equal(a[j+1:j+5], []string{s.Mount, s.Overlay, s.Root, s.Nspawn}) {
		t.Errorf("mount and nspawn %q", a[j+1:j+5])
	}
	flags := a[j+5:]
	for _, f := range []string{
		"-b", "-D", "--register=no", "--keep-unit", "--console=read-only", "--capability=all",
		"--system-call-filter=@keyring bpf", "--network-namespace-path=/run/netns/c-n1",
		"--bind=/s/n1/containerd:/var/lib/containerd", "--bind-ro=/img:/images", "--hostname=n1",
		"--resolv-conf=off", "--link-journal=no",
	} {
		if !slices.Contains(flags, f) {
			t.Errorf("nspawn flags lack %q: %q", f, flags)
		}
	}
}

func TestNetworkSteps(t *testing.T) {
	join := func(steps [][]string) string {
		var l []string
		for _, s := range steps {
			l = append(l, "ip "+strings.Join(s, " "))
		}
		return strings.Join(l, "\n")
	}
	if got, want := join(bridgeSteps("c-br")), `ip netns add c-br
ip -n c-br link set lo up
ip -n c-br link add br0 type bridge
ip -n c-br addr add 10.0.0.1/24 dev br0
ip -n c-br link set br0 up`; got != want {
		t.Errorf("bridge:\n%s", got)
	}
	if got, want := join(nodeSteps("c-n2", "c-br", "veth2", NodeIP(2))), `ip netns add c-n2
ip -n c-n2 link set lo up
ip -n c-n2 link add eth0 type veth peer name veth2 netns c-br
ip -n c-br link set veth2 master br0
ip -n c-br link set veth2 up
ip -n c-n2 addr add 10.0.0.12/24 dev eth0
ip -n c-n2 link set eth0 up
ip -n c-n2 route add default via 10.0.0.1 dev eth0`; got != want {
		t.Errorf("node:\n%s", got)
	}
	if got := strings.Join(podRouteStep("c-n1", PodSubnet(2), NodeIP(2)), " "); got != "-n c-n1 route replace 10.244.2.0/24 via 10.0.0.12 dev eth0" {
		t.Errorf("pod route: %s", got)
	}
}

func TestSysctlPlans(t *testing.T) {
	a, b, me := holder{PID: 10, Start: 1}, holder{PID: 11, Start: 1}, holder{PID: 12, Start: 1}
	host := map[string]string{"kernel.panic": "1"}
	ours := map[string]string{"kernel.panic": "10"}
	live := func(hs ...holder) func(holder) bool {
		return func(h holder) bool { return slices.Contains(hs, h) }
	}

	// First holder: the host's values are the originals.
	r := planAcquire(nil, "boot1", host, a, live(a))
	if r.Orig["kernel.panic"] != "1" || !slices.Equal(r.Holders, []holder{a}) {
		t.Fatalf("%+v", r)
	}
	// A second holder keeps the originals, not what the host shows now (ours).
	r2 := planAcquire(&r, "boot1", ours, b, live(a, b))
	if r2.Orig["kernel.panic"] != "1" || !slices.Equal(r2.Holders, []holder{a, b}) {
		t.Fatalf("%+v", r2)
	}
	// Everyone died without releasing: the next one still restores the true originals.
	r3 := planAcquire(&r2, "boot1", ours, me, live(me))
	if r3.Orig["kernel.panic"] != "1" || !slices.Equal(r3.Holders, []holder{me}) {
		t.Fatalf("%+v", r3)
	}
	// After a host reboot the record is stale: the host's values are the originals again.
	if r4 := planAcquire(&r2, "boot2", host, me, live(me)); r4.BootID != "boot2" || !slices.Equal(r4.Holders, []holder{me}) {
		t.Fatalf("%+v", r4)
	}

	// Release: nothing restored while another live holder remains.
	next, restore := planRelease(&r2, "boot1", a, live(a, b))
	if restore != nil || next == nil || !slices.Equal(next.Holders, []holder{b}) {
		t.Fatalf("%+v %v", next, restore)
	}
	// The last live holder restores.
	next, restore = planRelease(next, "boot1", b, live(b))
	if next != nil || restore["kernel.panic"] != "1" {
		t.Fatalf("%+v %v", next, restore)
	}
	// A dead co-holder does not keep the values set.
	if next, restore = planRelease(&r2, "boot1", b, live(b)); next != nil || restore == nil {
		t.Fatalf("%+v %v", next, restore)
	}
	// A record from before a reboot: nothing to restore.
	if next, restore = planRelease(&r2, "boot2", a, live(a)); next != nil || restore != nil {
		t.Fatalf("%+v %v", next, restore)
	}
}

func TestValidateTree(t *testing.T) {
	good := t.TempDir()
	if err := os.MkdirAll(filepath.Join(good, "usr/lib/systemd/system"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("usr/lib", filepath.Join(good, "lib")); err != nil {
		t.Fatal(err)
	}
	if err := ValidateTree(good); err != nil {
		t.Errorf("good tree: %v", err)
	}
	bad := t.TempDir()
	if err := os.MkdirAll(filepath.Join(bad, "lib/systemd/system"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := ValidateTree(bad); !errors.Is(err, ErrBadTree) || !strings.Contains(err.Error(), "usr/lib") {
		t.Errorf("a real /lib: %v, want ErrBadTree naming usr/lib", err)
	}
	if err := ValidateTree(filepath.Join(good, "missing")); !errors.Is(err, ErrBadTree) {
		t.Errorf("missing: %v", err)
	}
	f := filepath.Join(good, "file")
	if err := os.WriteFile(f, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := ValidateTree(f); !errors.Is(err, ErrBadTree) {
		t.Errorf("a file: %v", err)
	}
}

func TestRootfsKey(t *testing.T) {
	k := RootfsKey("bookworm", []string{"a", "b"})
	if k != RootfsKey("bookworm", []string{"b", "a"}) {
		t.Error("the package order must not matter")
	}
	if k == RootfsKey("bookworm", []string{"a", "b", "c"}) || k == RootfsKey("trixie", []string{"a", "b"}) {
		t.Error("packages and suite are part of the key")
	}
}

func TestConfigLayer(t *testing.T) {
	entries := configLayer()
	find := func(p string) layerEntry {
		for _, e := range entries {
			if e.Path == p {
				return e
			}
		}
		t.Fatalf("config layer has no %s", p)
		return layerEntry{}
	}
	if e := find("etc/systemd/system/etcd.service"); !e.Link || e.Data != "/dev/null" {
		t.Errorf("Debian's etcd.service must be masked: %+v", e)
	}
	cd := find("etc/containerd/config.toml").Data
	for _, s := range []string{"version = 3\n", `sandbox = "registry.k8s.io/pause:3.10.2"`, "restrict_oom_score_adj = true", "SystemdCgroup = false", `bin_dirs = ["/usr/lib/cni"]`} {
		if !strings.Contains(cd, s) {
			t.Errorf("containerd config lacks %s", s)
		}
	}
	if find("etc/systemd/system/multi-user.target.wants/"+FixupUnit).Data != "../"+FixupUnit {
		t.Error("fixup unit not enabled")
	}
	for _, e := range entries {
		if strings.Contains(e.Path, "cluster") || strings.Contains(e.Data, "/run/provider-kubernetes") {
			t.Errorf("the config layer writes the provider's cluster file (%s): only Kairos's boot stage may", e.Path)
		}
	}
	// The key follows the content.
	k := mustKey(t, entries)
	changed := slices.Clone(entries)
	changed[0].Data += "# changed\n"
	if mustKey(t, changed) == k {
		t.Error("a content change must change the key")
	}
	dir := filepath.Join(t.TempDir(), "layer")
	if err := writeLayer(dir, entries); err != nil {
		t.Fatal(err)
	}
	if l, err := os.Readlink(filepath.Join(dir, "etc/systemd/system/etcd.service")); err != nil || l != "/dev/null" {
		t.Errorf("mask on disk: %q %v", l, err)
	}
}

func mustKey(t *testing.T, entries []layerEntry) string {
	t.Helper()
	k, err := layerKey(entries)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// The Kairos layer is Kairos's own: the agent binary given (by content),
// kairos-init's notify stage, cos-setup-boot.service byte for byte as Kairos
// ships it and enabled as systemctl enable does, and the one harness unit
// that runs the real initramfs stage early.
func TestKairosLayer(t *testing.T) {
	agent := filepath.Join(t.TempDir(), "kairos-agent")
	if err := os.WriteFile(agent, []byte("#!/bin/sh\necho agent v1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	entries := kairosLayer(agent)
	dir := filepath.Join(t.TempDir(), "layer")
	if err := writeLayer(dir, entries); err != nil {
		t.Fatal(err)
	}
	read := func(p string) string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(dir, p))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if got := read(kairos.Agent); got != "#!/bin/sh\necho agent v1\n" {
		t.Errorf("agent %q", got)
	}
	if st, err := os.Stat(filepath.Join(dir, kairos.Agent)); err != nil || st.Mode().Perm() != 0o755 {
		t.Errorf("agent mode %v %v", st, err)
	}
	const shipped = "[Unit]\nDescription=cOS system configuration\nBefore=getty.target\n\n[Service]\nType=oneshot\nRemainAfterExit=yes\nExecStart=/usr/bin/kairos-agent run-stage boot\n\n[Install]\nWantedBy=multi-user.target\n"
	if got := read(kairos.CosSetupBootPath); got != shipped {
		t.Errorf("cos-setup-boot.service is not Kairos's:\n%s", got)
	}
	if l, err := os.Readlink(filepath.Join(dir, "etc/systemd/system/multi-user.target.wants", kairos.CosSetupBoot)); err != nil || l != kairos.CosSetupBootPath {
		t.Errorf("cos-setup-boot.service enabled as %q %v", l, err)
	}
	notify := read(kairos.NotifyStageFile)
	for _, s := range []string{"initramfs:", "kairos-agent notify agent.boot", "/run/cos/recovery_mode", "/run/cos/live_mode"} {
		if !strings.Contains(notify, s) {
			t.Errorf("notify stage lacks %q", s)
		}
	}
	init := read("usr/lib/systemd/system/" + kairos.InitramfsUnitName)
	for _, s := range []string{"ExecStart=/usr/bin/kairos-agent run-stage initramfs", "DefaultDependencies=no", "Before=sysinit.target cos-setup-boot.service"} {
		if !strings.Contains(init, s) {
			t.Errorf("initramfs unit lacks %q", s)
		}
	}
	for _, d := range []string{"oem", "usr/local/cloud-config", "system/providers"} {
		if st, err := os.Stat(filepath.Join(dir, d)); err != nil || !st.IsDir() {
			t.Errorf("%s: %v", d, err)
		}
	}
	// The key follows the agent's content, not only its path.
	k := mustKey(t, entries)
	if err := os.WriteFile(agent, []byte("#!/bin/sh\necho agent v2\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if mustKey(t, entries) == k {
		t.Error("a new agent binary must change the layer's key")
	}
}

func TestParseUnitShow(t *testing.T) {
	for _, c := range []struct {
		out      string
		finished bool
		status   int
	}{
		// A oneshot (no RemainAfterExit) that ran and exited 0.
		{"ActiveState=inactive\nSubState=dead\nResult=success\nExecMainStatus=0\nExecMainExitTimestampMonotonic=5123456\n", true, 0},
		// Not started yet in this boot: inactive too, but nothing exited.
		{"ActiveState=inactive\nSubState=dead\nResult=success\nExecMainStatus=0\nExecMainExitTimestampMonotonic=0\n", false, 0},
		// Still running (an earlier ExecStart of a oneshot exited).
		{"ActiveState=activating\nSubState=start\nResult=success\nExecMainStatus=0\nExecMainExitTimestampMonotonic=77\n", false, 0},
		// Refused: exit 3, failed.
		{"ActiveState=failed\nSubState=failed\nResult=exit-code\nExecMainStatus=3\nExecMainExitTimestampMonotonic=99\n", true, 3},
		// Skipped by a condition (no cluster: section): finished, never ran.
		{"ActiveState=inactive\nSubState=dead\nResult=success\nExecMainStatus=0\nExecMainExitTimestampMonotonic=0\nConditionResult=no\nConditionTimestampMonotonic=4000\n", true, 0},
		// Its conditions not checked yet (the job waits for its After= units).
		{"ActiveState=inactive\nSubState=dead\nResult=success\nExecMainStatus=0\nExecMainExitTimestampMonotonic=0\nConditionResult=no\nConditionTimestampMonotonic=0\n", false, 0},
	} {
		u := parseUnitShow("u.service", c.out)
		if u.Finished != c.finished || u.ExecMainStatus != c.status {
			t.Errorf("%q: %+v", c.out, u)
		}
	}
}

func TestExecArgv(t *testing.T) {
	procs := []string{"/sys/fs/cgroup/memory/p/pk-e2e-c-n1/cgroup.procs", "/sys/fs/cgroup/systemd/pk-e2e-c-n1/payload/cgroup.procs"}
	got := execArgv(procs, "/usr/bin/nsenter", 4242, []string{"systemctl", "is-system-running"})
	want := append(append([]string{"-c", execScript, "pk-e2e-exec"}, procs...),
		"--", "/usr/bin/nsenter", "-t", "4242", "-a", "--", "systemctl", "is-system-running")
	if !slices.Equal(got, want) {
		t.Errorf("got  %q\nwant %q", got, want)
	}
}

func TestContainerCgroups(t *testing.T) {
	// systemd PID 1 of a node: at the node's root in the controllers, in
	// /init.scope under nspawn's payload cgroup in the hierarchies it manages.
	leader := "9:name=systemd:/pk-e2e-c-n1/payload/init.scope\n4:memory:/process_api/e30f/pk-e2e-c-n1\n3:cpuset:/pk-e2e-c-n1\n1:cpu:/pk-e2e-c-n1\n0::/pk-e2e-c-n1/payload/init.scope\n"
	got, err := containerCgroups(hostMountinfo, leader)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"/sys/fs/cgroup/cpu/pk-e2e-c-n1/cgroup.procs",
		"/sys/fs/cgroup/cpuset/pk-e2e-c-n1/cgroup.procs",
		"/sys/fs/cgroup/memory/process_api/e30f/pk-e2e-c-n1/cgroup.procs",
		"/sys/fs/cgroup/systemd/pk-e2e-c-n1/payload/cgroup.procs",
		"/sys/fs/cgroup/unified/pk-e2e-c-n1/payload/cgroup.procs",
	}
	if !slices.Equal(got, want) {
		t.Errorf("got  %q\nwant %q", got, want)
	}
}

// The load balancer's configuration is one HAProxy takes: checked by the
// real haproxy (-c), no root needed.
func TestLBConfigValid(t *testing.T) {
	bin := findTool("haproxy")
	if bin == "" {
		testutil.SkipUnlessCI(t, "haproxy is not installed (apt-get install "+LBPackage+")")
	}
	cfg := filepath.Join(t.TempDir(), "haproxy.cfg")
	if err := os.WriteFile(cfg, []byte(lbConfig(BridgeIP+":6443", []string{"10.0.0.11:6443", "10.0.0.12:6443"})), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "-c", "-f", cfg).CombinedOutput()
	if err != nil {
		t.Fatalf("haproxy -c: %v\n%s", err, out)
	}
}
