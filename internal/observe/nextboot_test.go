package observe

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/fsutil"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
	"github.com/kairos-io/provider-kubernetes/pkg/clusterconfig"
)

func accept(*clusterconfig.Cluster) ([]string, error) { return nil, nil }

// The files kairos-agent's collector reads, walked as it walks them: both
// directories, subdirectories included, in name order; only .yaml and
// .yml, only under 2 MiB, only with a cloud-config header.
func TestNextBootConfigReadsWhatKairosReads(t *testing.T) {
	n := testutil.NewNode(t, "w1")
	o := &Observer{Root: n.R()}
	n.Write("/oem/sub/10_pin.yaml", testutil.CloudConfig("worker", "v1.37.2"), 0o600)
	n.Write("/oem/20_other.yml", "#cloud-config\nhostname: w1\nconfig_url: https://example.invalid/c.yaml\n", 0o600)
	n.Write("/oem/30_notes.txt", testutil.CloudConfig("worker", "v1.36.3"), 0o600)
	n.Write("/oem/40_noheader.yaml", strings.TrimPrefix(testutil.CloudConfig("worker", "v1.36.3"), "#cloud-config\n"), 0o600)
	n.Write("/usr/local/cloud-config/cluster.kairos.yaml", "#cloud-config\nname: provider-kubernetes\nstages: {}\n", 0o600)
	n.Write("/oem/50_big.yaml", "#cloud-config\n"+strings.Repeat("# padding\n", 2<<20/10)+testutil.CloudConfig("worker", "v1.36.3")[len("#cloud-config\n"):], 0o600)
	cfg, notes, err := o.NextBootConfig(accept)
	if err != nil || cfg.Pin != "v1.37.2" || cfg.Role != "worker" {
		t.Fatalf("%+v %v %q", cfg, err, notes)
	}
	for _, want := range []string{"the next boot's cluster: section from /oem/sub/10_pin.yaml", "cloud-config /oem/20_other.yml has a config_url",
		"cloud-config /oem/50_big.yaml is 2 MiB or more: skipped"} {
		if !strings.Contains(strings.Join(notes, "\n"), want) {
			t.Fatalf("no note %q in %q", want, notes)
		}
	}
	// Just under 2 MiB it is read, as kairos-agent reads it: two sections.
	if err := os.Truncate(n.Path("/oem/50_big.yaml"), 0); err != nil {
		t.Fatal(err)
	}
	n.Write("/oem/50_big.yaml", testutil.CloudConfig("worker", "v1.36.3")+strings.Repeat("#\n", (clusterconfig.MaxCloudConfigFile-len(testutil.CloudConfig("worker", "v1.36.3")))/2), 0o600)
	if _, _, err := o.NextBootConfig(accept); err == nil || !strings.Contains(err.Error(), "in 2 cloud-config files (/oem/50_big.yaml, /oem/sub/10_pin.yaml)") {
		t.Fatalf("%v", err)
	}
}

// Nothing it cannot read as the boot would is decided on: a special file
// is refused without blocking, a file another user could have written is
// not trusted, a section the plugin refuses is refused, no section is
// ErrNoSection.
func TestNextBootConfigRefusesOnDoubt(t *testing.T) {
	n := testutil.NewNode(t, "w1")
	o := &Observer{Root: n.R()}
	if _, _, err := o.NextBootConfig(accept); !errors.Is(err, ErrNoSection) {
		t.Fatalf("no cloud-config at all: %v", err)
	}
	n.Write("/oem/90_custom.yaml", testutil.CloudConfig("worker", "v1.37.2"), 0o600)
	testutil.Plant(t, n.Path("/oem/91_fifo.yaml"), testutil.FIFO)
	testutil.Within(t, 5*time.Second, "a FIFO in /oem", func() {
		if _, _, err := o.NextBootConfig(accept); err == nil || !strings.Contains(err.Error(), "cloud-config /oem/91_fifo.yaml is a FIFO, not a regular file") {
			t.Errorf("%v", err)
		}
	}, func() { testutil.Unblock(n.Path("/oem/91_fifo.yaml")) })
	os.Remove(n.Path("/oem/91_fifo.yaml"))
	if err := os.Chmod(n.Path("/oem/90_custom.yaml"), 0o666); err != nil {
		t.Fatal(err)
	}
	if _, _, err := o.NextBootConfig(accept); !errors.Is(err, fsutil.ErrUntrusted) {
		t.Fatalf("a world-writable cloud-config: %v", err)
	}
	if err := os.Chmod(n.Path("/oem/90_custom.yaml"), 0o600); err != nil {
		t.Fatal(err)
	}
	refuse := func(*clusterconfig.Cluster) ([]string, error) {
		return nil, errors.New("role (a value of 6 characters, not shown) is not init, controlplane or worker")
	}
	if _, _, err := o.NextBootConfig(refuse); err == nil || err.Error() != "the cloud-config's cluster: section in /oem/90_custom.yaml would be refused at boot (agent.boot: cluster: role (a value of 6 characters, not shown) is not init, controlplane or worker)" {
		t.Fatalf("%v", err)
	}
	n.Write("/oem/90_custom.yaml", "#cloud-config\ncluster: [not, a, map\n", 0o600)
	if _, _, err := o.NextBootConfig(accept); err == nil || !strings.Contains(err.Error(), "cloud-config /oem/90_custom.yaml: not a YAML map of keys") {
		t.Fatalf("%v", err)
	}
}

// The search below /oem is bounded like pin's (clusterconfig's bounds): a
// tree too deep or too large is an error, never an endless search or a
// directory read whole, and nothing is decided on it.
func TestNextBootConfigSearchIsBounded(t *testing.T) {
	n := testutil.NewNode(t, "w1")
	o := &Observer{Root: n.R()}
	deep := "/oem" + strings.Repeat("/d", clusterconfig.MaxCloudConfigDepth)
	n.Write(deep+"/90_custom.yaml", testutil.CloudConfig("worker", "v1.37.2"), 0o600)
	if _, _, err := o.NextBootConfig(accept); err == nil || !strings.Contains(err.Error(), "nested more than") {
		t.Fatalf("a tree %d deep: %v", clusterconfig.MaxCloudConfigDepth, err)
	}
	n = testutil.NewNode(t, "w2")
	o = &Observer{Root: n.R()}
	n.Write("/oem/90_custom.yaml", testutil.CloudConfig("worker", "v1.37.2"), 0o600)
	if _, _, err := o.NextBootConfig(accept); err != nil {
		t.Fatalf("one file: %v", err)
	}
	for i := 0; i < clusterconfig.MaxCloudConfigEntries; i++ {
		if err := os.WriteFile(n.Path(fmt.Sprintf("/oem/x%05d.txt", i)), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := o.NextBootConfig(accept); err == nil || !strings.Contains(err.Error(), "more than 4096 entries") {
		t.Fatalf("%d entries: %v", clusterconfig.MaxCloudConfigEntries+1, err)
	}
}

// A real Kairos node's shape (kairos-init's 10_accounting.yaml, at every
// boot): /oem and /usr/local/cloud-config root:admin 0770, their files
// root:admin, and %admin allowed every command by sudo. admin's members
// are root already, so the next boot's section is read (the preflight on a
// real node depended on it); the same directories without that sudo line
// are not trusted.
func TestNextBootConfigOnKairosAccounts(t *testing.T) {
	testutil.RequireRoot(t) // root:admin
	for _, sudo := range []string{"%admin ALL=(ALL) NOPASSWD: ALL", "%ops ALL=(ALL) NOPASSWD: ALL"} {
		n := testutil.NewNode(t, "w1")
		o := &Observer{Root: n.R()}
		n.Write("/etc/group", "root:x:0:\nadmin:x:900:kairos\nops:x:901:\n", 0o644)
		n.Write("/etc/sudoers", "root ALL=(ALL) ALL\n"+sudo+"\n", 0o600)
		n.Write("/oem/90_custom.yaml", testutil.CloudConfig("worker", "v1.37.2"), 0o640)
		n.Write("/usr/local/cloud-config/cluster.kairos.yaml", "#cloud-config\nname: provider-kubernetes\nstages: {}\n", 0o600)
		for _, p := range []string{"/oem", "/oem/90_custom.yaml", "/usr/local/cloud-config", "/usr/local/cloud-config/cluster.kairos.yaml"} {
			if err := os.Chown(n.Path(p), 0, 900); err != nil {
				t.Fatal(err)
			}
		}
		for _, d := range []string{"/oem", "/usr/local/cloud-config"} {
			if err := os.Chmod(n.Path(d), 0o770); err != nil {
				t.Fatal(err)
			}
		}
		cfg, _, err := o.NextBootConfig(accept)
		if trusted := strings.HasPrefix(sudo, "%admin"); trusted {
			if err != nil || cfg.Pin != "v1.37.2" {
				t.Fatalf("%q: %+v %v", sudo, cfg, err)
			}
		} else if !errors.Is(err, fsutil.ErrUntrusted) {
			t.Fatalf("%q: admin may not sudo, yet: %+v %v", sudo, cfg, err)
		}
	}
}
