package reconcile

import (
	"encoding/json"
	"testing"
	"time"
)

func TestDefaultBudgetsFitThePassBound(t *testing.T) {
	b := DefaultBudgets()
	if b.Total() > PassBound {
		t.Fatalf("default budgets add up to %s, above the documented bound %s", b.Total(), PassBound)
	}
}

func TestBudgetOverrides(t *testing.T) {
	b, err := DefaultBudgets().WithOverrides(json.RawMessage(`{"budgets":{"verify":"90s","localAPI":"1m"}}`))
	if err != nil || b.Verify != 90*time.Second || b.LocalAPI != time.Minute {
		t.Fatalf("%+v %v", b, err)
	}
	for _, bad := range []string{
		`{"budgets":{"verify":"soon"}}`,
		`{"budgets":{"verify":"-1s"}}`,
		`{"budgets":{"nope":"1s"}}`,
		`{"budgets":{"kubeadmUpgrade":"2h"}}`,
		`{"budgets":["verify"]}`,
	} {
		if _, err := DefaultBudgets().WithOverrides(json.RawMessage(bad)); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}
