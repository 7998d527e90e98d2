// Package kairos holds the fast test of the real Kairos client against the
// built provider (no nodes): see chain_test.go. The end-to-end suite runs
// the same chain on booted nodes (tests/e2e).
package kairos
