package cli

import (
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/kairos-io/provider-kubernetes/internal/fsutil"
	"github.com/kairos-io/provider-kubernetes/internal/plugin"
	"github.com/kairos-io/provider-kubernetes/internal/reconcile"
	"github.com/kairos-io/provider-kubernetes/internal/runner"
	"github.com/kairos-io/provider-kubernetes/internal/status"
	"github.com/kairos-io/provider-kubernetes/pkg/clusterconfig"
)

// checked is what `validate` found in a cloud-config: -o json prints
// it. Role, pin and the providerConfig keys are set only for a valid
// file, whose values the checks have accepted; a problem describes a
// value, never quotes it.
type checked struct {
	File           string   `json:"file"`
	Valid          bool     `json:"valid"`
	Role           string   `json:"role,omitempty"`
	Pin            string   `json:"pin,omitempty"`
	ProviderConfig []string `json:"providerConfig,omitempty"`
	Problems       []string `json:"problems"`
	Warnings       []string `json:"warnings"`
}

// validateCloudConfig applies to a cloud-config file's bytes the checks a
// boot applies: Kairos's header (kairos-agent's collector), the cluster:
// section as the plugin parses it, and everything agent.boot refuses
// (plugin.Problems: the section, providerConfig's budgets as the pass reads
// them, what the bootstrap step renders). Every problem is listed.
func validateCloudConfig(file string, b []byte) checked {
	v := checked{File: file, Problems: []string{}, Warnings: []string{}}
	var problems []error
	if !clusterconfig.HasCloudConfigHeader(b) {
		problems = append(problems, errors.New("no #cloud-config header (or #kairos-config, #node-config) among its first ten lines: Kairos does not read it as a cloud-config"))
	}
	c, ps := clusterconfig.ParseCloudConfigProblems(b)
	problems = append(problems, ps...)
	switch {
	case c != nil:
		var warnings []string
		warnings, ps = plugin.Problems(c)
		problems = append(problems, ps...)
		v.Warnings = append(v.Warnings, warnings...)
	case len(ps) == 0:
		problems = append(problems, errors.New("no cluster: section: the plugin would run no reconcile pass"))
	}
	for _, p := range problems {
		// Each line says what is invalid without the sentinel's prefix.
		msg := strings.TrimPrefix(p.Error(), clusterconfig.ErrInvalid.Error()+": ")
		msg = strings.TrimPrefix(msg, reconcile.ErrProviderConfig.Error()+": ")
		v.Problems = append(v.Problems, runner.Sanitize(msg, 600))
	}
	if len(problems) > 0 {
		return v
	}
	v.Valid, v.Role = true, c.Role
	if k, err := c.Kubeadm(); err == nil {
		v.Pin, _ = k.Pin()
	}
	for key := range c.ProviderConfig {
		v.ProviderConfig = append(v.ProviderConfig, key)
	}
	sort.Strings(v.ProviderConfig)
	return v
}

// cmdValidate is `provider-kubernetes validate FILE`: exit 0 valid, 1
// invalid or unreadable, 2 usage. It writes nothing but its output.
func cmdValidate(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := newFlags("validate", stdout, stderr)
	out := outputFlag(fs)
	file, code, ok := parseArg(fs, args)
	if !ok {
		return code
	}
	if file == "" {
		return fs.usageError("validate: the cloud-config file to check is missing: validate FILE (- reads stdin)")
	}
	b, err := readCloudConfig(file, stdin)
	if err != nil {
		fmt.Fprintf(stderr, "validate: %s\n", status.Printable(err.Error()))
		return reconcile.ExitFailed
	}
	v := validateCloudConfig(file, b)
	// json keeps a problem's "<64 hex digits>" as written.
	if err := emit(stdout, *out, v, func(w io.Writer) error { printValidation(w, stderr, v); return nil }); err != nil {
		fmt.Fprintf(stderr, "validate: %s\n", status.Printable(err.Error()))
		return reconcile.ExitFailed
	}
	if !v.Valid {
		return reconcile.ExitFailed
	}
	return reconcile.ExitOK
}

// readCloudConfig reads file, or stdin for "-", as kairos-agent's
// collector would take it: a regular file (no symlink followed, no FIFO
// waited on) under its 2 MiB bound.
func readCloudConfig(file string, stdin io.Reader) ([]byte, error) {
	const limit = clusterconfig.MaxCloudConfigFile
	var b []byte
	var err error
	if file == "-" {
		if stdin == nil {
			stdin = strings.NewReader("")
		}
		if b, err = io.ReadAll(io.LimitReader(stdin, limit+1)); err == nil && len(b) > limit {
			err = fmt.Errorf("stdin: %w (limit %d)", fsutil.ErrTooLarge, limit)
		}
	} else {
		b, err = fsutil.ReadFileNoFollow(file, limit)
	}
	if errors.Is(err, fsutil.ErrTooLarge) {
		return nil, fmt.Errorf("%w: kairos-agent skips a cloud-config of 2 MiB or more", err)
	}
	return b, err
}

// printValidation prints a valid file's one-line summary (its warnings on
// stderr), or every problem, one a line.
func printValidation(stdout, stderr io.Writer, v checked) {
	name := status.Printable(v.File)
	if v.File == "-" {
		name = "(stdin)"
	}
	if v.Valid {
		keys := "none"
		if len(v.ProviderConfig) > 0 {
			keys = strings.Join(v.ProviderConfig, ", ")
		}
		fmt.Fprintf(stdout, "%s: valid: role %s, pin %s, providerConfig: %s\n", name, v.Role, v.Pin, keys)
		for _, w := range v.Warnings {
			fmt.Fprintf(stderr, "warning: %s\n", status.Printable(w))
		}
		return
	}
	s := "s"
	if len(v.Problems) == 1 {
		s = ""
	}
	fmt.Fprintf(stdout, "%s: invalid: %d problem%s\n", name, len(v.Problems), s)
	for _, p := range v.Problems {
		fmt.Fprintf(stdout, "  %s\n", status.Printable(p))
	}
}
