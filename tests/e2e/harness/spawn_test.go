package harness

import (
	"os/exec"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"
)

// A child with a parent-death signal dies when the thread that forked it
// ends; one forked by startOnSpawner lives on, even when it was asked for
// from a goroutine whose locked thread then ends (as the namespace dialers'
// do).
func TestSpawnedChildOutlivesEndedThreads(t *testing.T) {
	const n = 3
	// startAll starts n children, each from its own goroutine that locks
	// its thread and returns without unlocking it: Go ends those threads
	// (all but one, when it is the main thread, which Go keeps). It returns
	// how many of the children died within wait, as soon as enough did.
	startAll := func(start func(*exec.Cmd) error, wait time.Duration, enough int) int {
		var started, ended sync.WaitGroup
		release := make(chan struct{})
		cmds := make([]*exec.Cmd, n)
		started.Add(n)
		ended.Add(n)
		for i := range n {
			cmds[i] = exec.Command("sleep", "60")
			cmds[i].SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
			go func() {
				defer ended.Done()
				runtime.LockOSThread() // all n locked at once: n distinct threads
				if err := start(cmds[i]); err != nil {
					t.Error(err)
				}
				started.Done()
				<-release
			}()
		}
		started.Wait()
		close(release)
		ended.Wait()
		dead := make(chan struct{}, n)
		for _, c := range cmds {
			if c.Process == nil {
				t.FailNow()
			}
			t.Cleanup(func() { _ = c.Process.Kill() })
			go func() { _ = c.Wait(); dead <- struct{}{} }()
		}
		got, timeout := 0, time.After(wait)
		for got < enough {
			select {
			case <-dead:
				got++
			case <-timeout:
				return got
			}
		}
		return got
	}

	// The premise: started from such threads, the children are signalled.
	if dead := startAll((*exec.Cmd).Start, 10*time.Second, n-1); dead < n-1 {
		t.Fatalf("%d of %d children forked from ended threads were signalled: the premise of startOnSpawner is wrong", dead, n)
	}
	if dead := startAll(startOnSpawner, 2*time.Second, 1); dead != 0 {
		t.Fatalf("%d of %d children started by startOnSpawner died with the threads that asked for them", dead, n)
	}
}
