package runner

import (
	"context"
	"sync"
)

// Recorder is the test seam: it records every command line and answers
// from a function. It is in the package (not a _test file) so the
// reconcile, snapshot and repair tests share it.
type Recorder struct {
	mu    sync.Mutex
	cmds  []Cmd
	Reply func(ctx context.Context, c Cmd) (Result, error)
}

// Run implements Runner.
func (r *Recorder) Run(ctx context.Context, c Cmd) (Result, error) {
	r.mu.Lock()
	r.cmds = append(r.cmds, c)
	reply := r.Reply
	r.mu.Unlock()
	if reply == nil {
		return Result{}, nil
	}
	return reply(ctx, c)
}

// Lines returns the recorded command lines in order.
func (r *Recorder) Lines() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, len(r.cmds))
	for i, c := range r.cmds {
		out[i] = c.String()
	}
	return out
}

// Cmds returns the recorded commands.
func (r *Recorder) Cmds() []Cmd {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Cmd(nil), r.cmds...)
}
