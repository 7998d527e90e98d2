// Package e2e is the end-to-end suite of real kubeadm clusters (issues 7 and
// 8): nodes are systemd-nspawn containers run by package harness, each
// booting a per-minor OS tree over the harness's Debian base, driven only
// by the provider's own units. Scenarios call harness.RequireFull(t) so they
// run with PROVIDER_KUBERNETES_E2E=full (make e2e); `make test` runs the
// harness's node smoke test only.
package e2e
