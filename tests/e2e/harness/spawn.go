package harness

import (
	"os/exec"
	"runtime"
	"sync"
)

// A child started with a parent-death signal (SysProcAttr.Pdeathsig: the
// nodes' nspawn, the load balancer) gets it when the OS *thread* that
// forked it exits, not when the test process does. Go ends a thread when a
// goroutine that locked it returns without unlocking it, which is what the
// namespace dialers do (DialContext, a test reading a certificate from the
// bridge's namespace): whichever child had been forked from such a thread
// was signalled in the middle of a test (a worker powered off after its
// boot, its kube-proxy pod then stuck terminating, a DaemonSet rollout
// stalled). So every such child is forked from one thread that is locked
// for the life of the process and never ends.
var spawner struct {
	once sync.Once
	reqs chan spawnReq
}

type spawnReq struct {
	cmd  *exec.Cmd
	done chan error
}

// startOnSpawner is cmd.Start, forked from the spawner thread. Wait may be
// called from any goroutine.
func startOnSpawner(cmd *exec.Cmd) error {
	spawner.once.Do(func() {
		spawner.reqs = make(chan spawnReq)
		go func() {
			runtime.LockOSThread() // never unlocked: this thread never ends
			for r := range spawner.reqs {
				r.done <- r.cmd.Start()
			}
		}()
	})
	r := spawnReq{cmd: cmd, done: make(chan error, 1)}
	spawner.reqs <- r
	return <-r.done
}
