// Command pause is the pod sandbox process of the bundled pause image
// (registry.k8s.io/pause:<tag>, built from this source by the tree builder):
// it holds the pod's namespaces, reaps zombies, and exits on SIGINT/SIGTERM.
// Like the upstream one it answers -v with its version and exits 0: kubeadm
// upgrade's health-check Job runs the pause image with ["-v"] and waits for
// it to complete.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// version is stamped by the tree builder (-X main.version=3.10.2).
var version = "dev"

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-v" {
		fmt.Printf("pause.go version %s\n", version)
		return
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	chld := make(chan os.Signal, 16)
	signal.Notify(chld, syscall.SIGCHLD)
	for {
		select {
		case <-sig:
			return
		case <-chld:
			for {
				var ws syscall.WaitStatus
				pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
		}
	}
}
