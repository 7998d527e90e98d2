// Package e2e is the end-to-end suite of real kubeadm clusters (issues 7 and
// 8): nodes are systemd-nspawn containers run by package harness, each
// booting a per-minor OS tree over the harness's Debian base, driven only
// by the provider's own units. The scenarios run in `make test` as root
// (harness.Require); PROVIDER_KUBERNETES_E2E=off skips them.
package e2e
