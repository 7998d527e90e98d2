// Package plugin is the Kairos side of the provider: the go-pluggable events
// kairos-agent sends to every agent-provider-* binary. agent.boot (sent from
// the initramfs: no network, no API) validates the cloud-config's cluster:
// section and renders a yip config whose boot stage writes the cluster file
// and starts the reconcile unit; it never runs kubeadm. cluster.reset runs
// the reset. init.provider.info (sent by kairos-init while it builds the
// image) answers the provider's name and the bundled kubeadm's version.
// Nothing secret reaches the response, the log field, stdout or
// stderr: errors name keys, never values.
package plugin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"syscall"

	sdkbus "github.com/kairos-io/kairos-sdk/bus"
	"github.com/kairos-io/kairos-sdk/clusterplugin"
	pluggable "github.com/mudler/go-pluggable"

	"github.com/kairos-io/provider-kubernetes/internal/bootstrap"
	"github.com/kairos-io/provider-kubernetes/internal/fsutil"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/reconcile"
	"github.com/kairos-io/provider-kubernetes/internal/runner"
	"github.com/kairos-io/provider-kubernetes/internal/status"
	"github.com/kairos-io/provider-kubernetes/pkg/clusterconfig"
)

// Events the provider answers, and the name Kairos finds it under.
// The names are kairos-sdk's: agent.boot (sent by `kairos-agent notify
// agent.boot` from kairos-init's initramfs stage), cluster.reset (defined
// by the SDK; kairos-agent v2.31.4 itself never sends it) and
// init.provider.info (sent by kairos-init v0.16.4 to every provider in
// /system/providers; see providerinfo.go).
const (
	EventBoot  = sdkbus.EventBoot
	EventReset = clusterplugin.EventClusterReset
	EventInfo  = sdkbus.InitProviderInfo
	BinaryName = "agent-provider-kubernetes"
)

// MaxEventSize bounds the event read from stdin or from its file.
const MaxEventSize = 8 << 20

// IsEvent reports whether s names an event the provider handles.
func IsEvent(s string) bool {
	return s == string(EventBoot) || s == string(EventReset) || s == string(EventInfo)
}

// Options configure the plugin.
type Options struct {
	Root paths.Root
	// Reset runs the node reset for cluster.reset, logging to log.
	Reset func(ctx context.Context, log io.Writer) (status.Document, error)
}

// Serve answers one event: the event JSON on stdin, the response on stdout.
// The go-pluggable factory runs the handler and puts what it prints into
// the response's log field. A protocol failure (unreadable event) is
// returned after an error response is written.
func Serve(ctx context.Context, o Options, event string, stdin io.Reader, stdout io.Writer) error {
	ev, err := readEvent(stdin)
	if err != nil {
		writeError(stdout, err)
		return err
	}
	js, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	f := pluggable.NewPluginFactory(
		pluggable.FactoryPlugin{EventType: EventBoot, PluginHandler: func(e *pluggable.Event) pluggable.EventResponse { return o.onBoot(e) }},
		pluggable.FactoryPlugin{EventType: EventReset, PluginHandler: func(e *pluggable.Event) pluggable.EventResponse { return o.onReset(ctx, e) }},
		pluggable.FactoryPlugin{EventType: EventInfo, PluginHandler: func(e *pluggable.Event) pluggable.EventResponse { return o.onInfo(e) }},
	)
	return f.Run(pluggable.EventType(event), bytes.NewReader(js), stdout)
}

// readEvent reads the event, and its data from the file kairos-agent
// writes when the data is over 8 KiB: bounded, never through a symlink.
func readEvent(r io.Reader) (pluggable.Event, error) {
	var ev pluggable.Event
	b, err := io.ReadAll(io.LimitReader(r, MaxEventSize+1))
	if err != nil {
		return ev, fmt.Errorf("read the event: %w", err)
	}
	if len(b) > MaxEventSize {
		return ev, fmt.Errorf("the event is over %d bytes", MaxEventSize)
	}
	if err := json.Unmarshal(b, &ev); err != nil {
		return ev, fmt.Errorf("the event is not go-pluggable JSON: %v", err)
	}
	if ev.File != "" {
		if !filepath.IsAbs(ev.File) {
			return ev, fmt.Errorf("the event's data file %q is not an absolute path", ev.File)
		}
		data, err := fsutil.ReadFileNoFollow(ev.File, MaxEventSize)
		if err != nil {
			return ev, fmt.Errorf("read the event's data file: %w", err)
		}
		ev.Data, ev.File = string(data), ""
	}
	return ev, nil
}

func writeError(w io.Writer, err error) {
	b, _ := json.Marshal(pluggable.EventResponse{Error: err.Error()})
	_, _ = w.Write(b)
}

// bootPayload is agent.boot's data: the merged cloud-config.
type bootPayload struct {
	Config string `json:"config"`
}

// onBoot answers agent.boot. A refused section leaves the previous yip
// config in place (this boot runs the previous section), so the refusal is
// also recorded in paths.PluginError for the reconcile pass to report; an
// accepted section, or none, clears it.
func (o *Options) onBoot(e *pluggable.Event) pluggable.EventResponse {
	resp := o.boot(e)
	marker := o.Root.Path(paths.PluginError)
	if resp.Error == "" {
		if err := syscall.Unlink(marker); err != nil && !errors.Is(err, syscall.ENOENT) {
			return fail("agent.boot: remove %s: %v", paths.PluginError, err)
		}
		return resp
	}
	if err := fsutil.MkdirAllMode(filepath.Dir(marker), 0o755); err == nil {
		_ = fsutil.WriteFileAtomic(marker, []byte(resp.Error+"\n"), 0o600)
	}
	return resp
}

func (o *Options) boot(e *pluggable.Event) pluggable.EventResponse {
	var p bootPayload
	if err := json.Unmarshal([]byte(e.Data), &p); err != nil {
		return fail("agent.boot: the event data is not {\"config\": \"<cloud-config>\"}: %s", clusterconfig.RedactYAMLError(err))
	}
	// The section as kairos-sdk's cluster plugin reads it (clusterplugin.Config).
	c, section, err := clusterconfig.ParseCloudConfig([]byte(p.Config))
	if err != nil {
		return fail("agent.boot: %v", err)
	}
	if c == nil {
		// A previous boot's yip config would otherwise keep writing the
		// old section and starting passes: no section, no pass.
		file := o.Root.Path(paths.ClusterYipFile)
		switch err := syscall.Unlink(file); {
		case err == nil:
			fmt.Printf("provider-kubernetes: no cluster: section in the cloud-config: removed the previous %s, no reconcile pass will run\n", paths.ClusterYipFile)
		case errors.Is(err, syscall.ENOENT):
			fmt.Println("provider-kubernetes: no cluster: section in the cloud-config: nothing to do")
		default:
			return fail("agent.boot: no cluster: section, but the previous %s cannot be removed: %v", paths.ClusterYipFile, err)
		}
		return pluggable.EventResponse{}
	}
	warnings, err := Check(c)
	if err != nil {
		return fail("agent.boot: cluster: %v", err)
	}
	for _, w := range warnings {
		fmt.Println("provider-kubernetes: warning: " + w)
	}
	y, err := Render(section)
	if err != nil {
		return fail("agent.boot: render: %v", err)
	}
	file := o.Root.Path(paths.ClusterYipFile)
	if err := fsutil.MkdirAllMode(filepath.Dir(file), 0o755); err != nil {
		return fail("agent.boot: %s: %v", paths.CloudConfigDir, err)
	}
	if err := fsutil.WriteFileAtomic(file, y, 0o600); err != nil {
		return fail("agent.boot: write %s: %v", paths.ClusterYipFile, err)
	}
	fmt.Printf("provider-kubernetes: cluster section valid (role %s, control_plane_host %s); wrote %s: its boot stage writes %s and starts %s\n",
		c.Role, c.ControlPlaneHost, paths.ClusterYipFile, paths.ClusterFile, paths.ReconcileUnit)
	return pluggable.EventResponse{}
}

// Check is what agent.boot accepts of a cluster: section, and the
// warnings it prints for one it accepts (`provider-kubernetes preflight`
// asks it of the section the next boot will send): the section's keys and
// values, providerConfig (a bad budget fails the boot step, it is not found
// later by the pass), and what the bootstrap step will render must render
// (a role conflict or a bad secret fails the boot step, not the reconcile).
// The error is the first of Problems.
func Check(c *clusterconfig.Cluster) (warnings []string, err error) {
	warnings, problems := Problems(c)
	if len(problems) > 0 {
		return nil, problems[0]
	}
	return warnings, nil
}

// Problems is every problem Check finds (`provider-kubernetes validate`
// lists them): the section's, then providerConfig's, then, for a section
// with neither, what the bootstrap step would refuse to render.
func Problems(c *clusterconfig.Cluster) (warnings []string, problems []error) {
	_, problems = c.Problems()
	problems = append(problems, reconcile.DefaultBudgets().OverrideProblems(c.ProviderConfig)...)
	if len(problems) > 0 {
		// The renderers validate the section first: they would repeat one of these.
		return nil, problems
	}
	var err error
	if c.Role == clusterconfig.RoleInit {
		_, err = bootstrap.RenderInit(c)
	} else {
		_, err = bootstrap.RenderJoin(c)
		if errors.Is(err, bootstrap.ErrNoCAPin) {
			// A member needs no join material: warn, the join step refuses if it must join.
			return append(slices.Clone(c.Ignored), "no CA pin (joinConfiguration.discovery.bootstrapToken.caCertHashes or cluster.ca_certs): a node that is not yet a member will refuse to join"), nil
		}
	}
	if err != nil {
		return nil, []error{err}
	}
	return slices.Clone(c.Ignored), nil
}

func (o *Options) onReset(ctx context.Context, _ *pluggable.Event) pluggable.EventResponse {
	if o.Reset == nil {
		return fail("cluster.reset: this build cannot reset")
	}
	// The factory captures os.Stderr into the response's log field.
	doc, err := o.Reset(ctx, os.Stderr)
	if err != nil {
		return pluggable.EventResponse{State: doc.Phase, Error: fmt.Sprintf("cluster.reset: %s: %s", doc.Reason, doc.Message)}
	}
	return pluggable.EventResponse{State: doc.Phase}
}

func fail(format string, a ...any) pluggable.EventResponse {
	return pluggable.EventResponse{Error: runner.Sanitize(fmt.Sprintf(format, a...), 2000)}
}
