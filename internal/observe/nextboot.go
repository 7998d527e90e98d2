package observe

import (
	"errors"
	"fmt"
	"os"
	"path"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
	yaml3 "gopkg.in/yaml.v3"

	"github.com/kairos-io/provider-kubernetes/internal/fsutil"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/pkg/clusterconfig"
	"github.com/kairos-io/provider-kubernetes/pkg/plan"
)

// CloudConfigDirs are the directories `kairos-agent notify agent.boot`
// reads the cloud-config from at boot, in its order (kairos-agent v2.31.4:
// the notify command's default; kairos-init's initramfs stage runs it with
// no directory given). Both are on the node's persistent partitions: what
// is there now is what the next boot sends the plugin.
var CloudConfigDirs = []string{"/oem", paths.CloudConfigDir}

// ErrNoSection: the cloud-config has no cluster: section; the next boot's
// plugin removes its boot stage and no reconcile pass runs.
var ErrNoSection = errors.New("no cluster: section in the cloud-config")

// NextBootConfig reads the cluster: section the next boot's agent.boot
// will hand the plugin: the cloud-config files under CloudConfigDirs as
// kairos-agent's collector picks them (walked in name order, .yaml and
// .yml files under 2 MiB with a #cloud-config, #kairos-config or
// #node-config header among their first ten lines), each read beneath the
// root like the cluster file (no symlink followed anywhere, nothing that
// someone other than root could have written; a directory Kairos gives its
// admin group, root by sudo, counts as root's: fsutil.AdminGroups). check is what the plugin
// refuses at boot (plugin.Check): a section it refuses is an error, as the
// pass reports it. The notes say where the section came from.
//
// It decides only on what it can read exactly as the boot will: a section
// spread over several files (merged at boot), a cloud-config file it
// cannot parse or read (skipped at boot, with whatever it held) and a
// symlink or special file among them are errors, nothing is decided on
// doubt; a config_url (fetched at boot) is not followed, and noted.
func (o *Observer) NextBootConfig(check func(*clusterconfig.Cluster) ([]string, error)) (Config, []string, error) {
	var files, notes []string
	for _, dir := range CloudConfigDirs {
		entries := 0
		found, err := o.cloudConfigFiles(dir, 0, &entries)
		if err != nil {
			return Config{}, notes, err
		}
		files = append(files, found...)
	}
	var with []string
	var cluster *clusterconfig.Cluster
	// Kairos makes /oem and /usr/local/cloud-config root:admin 0770, and
	// admin's members are root by sudo (fsutil.AdminGroups).
	admins := fsutil.AdminGroups(string(o.Root))
	for _, f := range files {
		b, err := fsutil.ReadFileTrustedBy(string(o.Root), f, clusterconfig.MaxCloudConfigFile, admins)
		if errors.Is(err, fsutil.ErrTooLarge) {
			notes = append(notes, "cloud-config "+f+" is 2 MiB or more: skipped, as kairos-agent skips it")
			continue
		}
		if err != nil {
			return Config{}, notes, fmt.Errorf("cloud-config %s: %w", f, err)
		}
		if !clusterconfig.HasCloudConfigHeader(b) {
			continue
		}
		var top map[string]yaml3.Node
		if err := yaml3.Unmarshal(b, &top); err != nil {
			return Config{}, notes, fmt.Errorf("cloud-config %s: not a YAML map of keys (kairos-agent would skip it, with whatever it holds): %s", f, clusterconfig.RedactYAMLError(err))
		}
		if _, ok := top["config_url"]; ok {
			notes = append(notes, "cloud-config "+f+" has a config_url: the configuration it names is fetched at boot, not here")
		}
		c, _, err := clusterconfig.ParseCloudConfig(b)
		if err != nil {
			return Config{}, notes, fmt.Errorf("cloud-config %s: %w", f, err)
		}
		if c != nil {
			with = append(with, f)
			cluster = c
		}
	}
	switch len(with) {
	case 0:
		return Config{}, notes, fmt.Errorf("%w (%s)", ErrNoSection, strings.Join(CloudConfigDirs, ", "))
	case 1:
	default:
		return Config{}, notes, fmt.Errorf("the cluster: section is in %d cloud-config files (%s): kairos-agent merges them at boot, this check decides only on one: keep the section in one file",
			len(with), strings.Join(with, ", "))
	}
	notes = append(notes, "the next boot's cluster: section from "+with[0])
	warnings, err := check(cluster)
	if err != nil {
		return Config{}, notes, fmt.Errorf("the cloud-config's cluster: section in %s would be refused at boot (agent.boot: cluster: %v)", with[0], err)
	}
	for _, w := range warnings {
		notes = append(notes, "agent.boot would warn: "+w)
	}
	cfg, err := configOf(cluster)
	if err != nil {
		return Config{}, notes, fmt.Errorf("%s: %w", with[0], err)
	}
	return cfg, notes, nil
}

// configOf is a parsed cluster section's kubeadm config and pin.
func configOf(c *clusterconfig.Cluster) (Config, error) {
	k, err := c.Kubeadm()
	if err != nil {
		return Config{}, err
	}
	pin, err := k.Pin()
	if err != nil {
		return Config{}, err
	}
	return Config{Cluster: c, Kubeadm: k, Pin: pin, Role: plan.Role(c.Role)}, nil
}

// cloudConfigFiles lists the cloud-config candidates under dir (a host
// path), recursively in name order as filepath.Walk does, without
// following a symlink. A missing dir has none. A tree deeper than
// clusterconfig.MaxCloudConfigDepth or holding more than
// MaxCloudConfigEntries entries (counted in *entries) is an error: nothing
// is decided on a search cut short.
func (o *Observer) cloudConfigFiles(dir string, depth int, entries *int) ([]string, error) {
	if depth >= clusterconfig.MaxCloudConfigDepth {
		return nil, fmt.Errorf("cloud-config directory %s is nested more than %d directories deep: not searched further", dir, clusterconfig.MaxCloudConfigDepth)
	}
	d, err := fsutil.OpenDirNoFollow(string(o.Root), dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("cloud-config directory %s: %w", dir, err)
	}
	defer d.Close()
	ents, err := fsutil.ReadDirAtMost(d, clusterconfig.MaxCloudConfigEntries-*entries)
	if *entries += len(ents); errors.Is(err, fsutil.ErrTooLarge) {
		return nil, fmt.Errorf("the cloud-config directories hold more than %d entries: not searched further", clusterconfig.MaxCloudConfigEntries)
	}
	if err != nil {
		return nil, fmt.Errorf("cloud-config directory %s: %w", dir, err)
	}
	sort.Slice(ents, func(i, j int) bool { return ents[i].Name() < ents[j].Name() })
	var out []string
	for _, e := range ents {
		p := path.Join(dir, e.Name())
		switch {
		case e.IsDir():
			sub, err := o.cloudConfigFiles(p, depth+1, entries)
			if err != nil {
				return nil, err
			}
			out = append(out, sub...)
		case path.Ext(p) != ".yaml" && path.Ext(p) != ".yml":
			// Not a cloud-config to kairos-agent.
		case e.Type().IsRegular():
			out = append(out, p)
		default:
			kind := "not a regular file"
			var st unix.Stat_t
			if unix.Fstatat(int(d.Fd()), e.Name(), &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
				kind = fsutil.Kind(st.Mode)
			}
			return nil, fmt.Errorf("cloud-config %s is %s, not a regular file: not read (kairos-agent would follow or open it at boot)", p, kind)
		}
	}
	return out, nil
}
