package reconcile

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/kairos-io/provider-kubernetes/pkg/clusterconfig"
)

func TestDefaultBudgetsFitThePassBound(t *testing.T) {
	b := DefaultBudgets()
	if b.Total() > PassBound {
		t.Fatalf("default budgets add up to %s, above the documented bound %s", b.Total(), PassBound)
	}
	if b.EtcdSnapshot > MaxEtcdSnapshot {
		t.Fatalf("the default snapshot budget %s is above its bound %s", b.EtcdSnapshot, MaxEtcdSnapshot)
	}
}

func TestBudgetOverrides(t *testing.T) {
	b, err := DefaultBudgets().WithOverrides(map[string]string{"budget.verify": "90s", "budget.localAPI": " 1m", "budget.etcdSnapshot": "45s"})
	if err != nil || b.Verify != 90*time.Second || b.LocalAPI != time.Minute || b.EtcdSnapshot != 45*time.Second {
		t.Fatalf("%+v %v", b, err)
	}
	if b, err := DefaultBudgets().WithOverrides(nil); err != nil || b != DefaultBudgets() {
		t.Fatalf("no providerConfig: %+v %v", b, err)
	}
	for _, k := range BudgetKeys() {
		if _, err := DefaultBudgets().WithOverrides(map[string]string{k: "1s"}); err != nil {
			t.Errorf("%s: %v", k, err)
		}
	}
	const secret = "Zq8-r4Nd0m-cluster-T0ken-9f3a"
	for _, tc := range []struct {
		pc   map[string]string
		want string
	}{
		{map[string]string{"budget.verify": "soon"}, "budget.verify is not a positive Go duration"},
		{map[string]string{"budget.verify": "-1s"}, "budget.verify is not a positive Go duration"},
		{map[string]string{"budget.verify": "0s"}, "budget.verify is not a positive Go duration"},
		{map[string]string{"budget.verify": secret}, "budget.verify is not a positive Go duration"},
		{map[string]string{"budget.nope": "1s"}, "unknown key, a key of 11 characters (not shown):"},
		{map[string]string{"budget.verfy": "1s"}, "unknown key, a key of 12 characters (not shown; did you mean budget.verify?)"},
		{map[string]string{"budgets": "verify=1s"}, "unknown key, a key of 7 characters (not shown)"},
		{map[string]string{"verify": "1s"}, "unknown key, a key of 6 characters (not shown; did you mean budget.verify?)"},
		{map[string]string{secret: "1s"}, "unknown key, a key of 29 characters (not shown)"},
		{map[string]string{"correct-horse-battery-staple-galaxy": "1s"}, "unknown key, a key of 35 characters (not shown)"},
		{map[string]string{"budget.kubeadmUpgrade": "2h"}, "above the pass bound"},
		// upgrades.md: the snapshot "is bounded at two minutes": lower, never higher.
		{map[string]string{"budget.etcdSnapshot": "2m1s"}, "budget.etcdSnapshot is above the snapshot step's bound of 2m0s"},
		{map[string]string{"budget.etcdSnapshot": "10m"}, "may be lowered, not raised"},
		{map[string]string{"images.pin": "no"}, `providerConfig images.pin is neither "true" nor "false"`},
		{map[string]string{"images.pin": secret}, `providerConfig images.pin is neither "true" nor "false"`},
		{map[string]string{"images.pins": "false"}, "did you mean images.pin?"},
	} {
		_, err := DefaultBudgets().WithOverrides(tc.pc)
		if !errors.Is(err, ErrProviderConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.pc, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), secret) {
			t.Errorf("%v: the error quotes a value: %v", tc.pc, err)
		}
	}
	if _, err := DefaultBudgets().WithOverrides(map[string]string{"budget.etcdSnapshot": "2m"}); err != nil {
		t.Errorf("exactly the bound: %v", err)
	}
}

// Budgets whose sum passes int64 used to wrap negative and be accepted,
// leaving the wait bounded only by the whole pass. Every one of these is
// refused, named by key, without the value.
func TestBudgetOverridesThatOverflow(t *testing.T) {
	maxDur := time.Duration(math.MaxInt64).String() // 2562047h47m16.854775807s
	for _, pc := range []map[string]string{
		{"budget.waitForCluster": maxDur},
		{"budget.controlPlaneReady": maxDur},
		{"budget.waitForCluster": "2562047h", "budget.verify": "2562047h"},
		{"budget.kubeadmUpgrade": "1281024h", "budget.clusterVersion": "1281024h"},
		{"budget.kubeadmBootstrap": "2562047h", "budget.controlPlaneReady": "2562047h"},
		{"budget.waitForCluster": "2562047h"},
		{"budget.apiRequest": maxDur},
		{"budget.verify": "51m"},
	} {
		b, err := DefaultBudgets().WithOverrides(pc)
		if !errors.Is(err, ErrProviderConfig) || !strings.Contains(err.Error(), "above the pass bound") {
			t.Errorf("%v: accepted (%v), total %s", pc, err, b.Total())
			continue
		}
		for _, v := range pc {
			if strings.Contains(err.Error(), v) {
				t.Errorf("%v: the error quotes the value: %v", pc, err)
			}
		}
	}
	// Total itself never wraps.
	huge := Budgets{WaitForCluster: time.Duration(math.MaxInt64), Verify: time.Duration(math.MaxInt64), ClusterVersion: time.Duration(math.MaxInt64)}
	if huge.Total() < PassBound {
		t.Errorf("a sum past int64 reads as %s", huge.Total())
	}
}

// clusterconfig names the budget keys in its errors from its own list.
func TestBudgetNamesMatchClusterconfig(t *testing.T) {
	var want []string
	for _, n := range clusterconfig.BudgetNames {
		want = append(want, BudgetKeyPrefix+n)
	}
	if strings.Join(want, ",") != strings.Join(BudgetKeys(), ",") {
		t.Fatalf("clusterconfig.BudgetNames %v, the budgets %v", want, BudgetKeys())
	}
}

// OverrideProblems lists every bad key and every bound crossed, in
// WithOverrides's order; WithOverrides returns the first.
func TestOverrideProblemsListsEveryKey(t *testing.T) {
	pc := map[string]string{"budget.verify": "soon", "budget.nope": "1s", "budget.etcdSnapshot": "10m", "budget.localAPI": "30s"}
	problems := DefaultBudgets().OverrideProblems(pc)
	want := []string{"unknown key, a key of 11", "budget.verify is not a positive", "etcdSnapshot is above the snapshot step's bound"}
	if len(problems) != len(want) {
		t.Fatalf("%d problems, want %d: %v", len(problems), len(want), problems)
	}
	for i, w := range want {
		if !errors.Is(problems[i], ErrProviderConfig) || !strings.Contains(problems[i].Error(), w) {
			t.Errorf("problem %d: %v, want %q", i, problems[i], w)
		}
	}
	if _, err := DefaultBudgets().WithOverrides(pc); err == nil || err.Error() != problems[0].Error() {
		t.Fatalf("WithOverrides: %v, want %v", err, problems[0])
	}
	if p := DefaultBudgets().OverrideProblems(map[string]string{"budget.localAPI": "30s"}); p != nil {
		t.Fatalf("a good providerConfig: %v", p)
	}
}

// certificates.renewBefore is checked with the budgets (the plugin at
// boot, validate offline, the pass): a positive Go duration up to a year,
// described, never quoted.
func TestRenewBeforeIsValidated(t *testing.T) {
	for _, ok := range []string{"720h", " 72h ", "1h", "8760h"} {
		if p := DefaultBudgets().OverrideProblems(map[string]string{"certificates.renewBefore": ok}); p != nil {
			t.Errorf("%q: %v", ok, p)
		}
	}
	const secret = "Zq8-r4Nd0m-cluster-T0ken-9f3a"
	for v, want := range map[string]string{
		"30d":    "certificates.renewBefore is not a positive Go duration",
		"0s":     "certificates.renewBefore is not a positive Go duration",
		"-720h":  "certificates.renewBefore is not a positive Go duration",
		"":       "certificates.renewBefore is not a positive Go duration",
		secret:   "certificates.renewBefore is not a positive Go duration",
		"8761h":  "certificates.renewBefore is above 8760h0m0s",
		"87600h": "it would renew on every boot",
	} {
		p := DefaultBudgets().OverrideProblems(map[string]string{"certificates.renewBefore": v, "budget.nope": "1s"})
		if len(p) != 2 || !errors.Is(p[1], ErrProviderConfig) || !strings.Contains(p[1].Error(), want) {
			t.Errorf("%q: %v, want the unknown key and %q", v, p, want)
			continue
		}
		if v != "" && strings.Contains(p[1].Error(), strings.TrimSpace(v)) {
			t.Errorf("%q: the error quotes the value: %v", v, p[1])
		}
	}
	// A near miss of the key is named as one.
	_, err := DefaultBudgets().WithOverrides(map[string]string{"certificates.renewbefore": "720h"})
	if err == nil || !strings.Contains(err.Error(), "did you mean certificates.renewBefore?") {
		t.Fatalf("near miss: %v", err)
	}
}
