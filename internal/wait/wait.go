// Package wait is the one bounded-wait primitive: a total budget, a poll
// interval, a per-attempt timeout, and on failure the last real error.
package wait

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Budget bounds a wait.
type Budget struct {
	Total      time.Duration // the whole wait
	Interval   time.Duration // between attempts (the provider uses at most 2 s)
	PerAttempt time.Duration // one attempt's own deadline
}

// ErrBudgetExhausted is wrapped by Poll when the total budget ran out.
var ErrBudgetExhausted = errors.New("budget exhausted")

// Clock is the time seam: real time on a node, a fake one in tests.
type Clock interface {
	Now() time.Time
	After(d time.Duration) <-chan time.Time
}

// RealClock is the wall clock.
type RealClock struct{}

// Now implements Clock.
func (RealClock) Now() time.Time { return time.Now() }

// After implements Clock.
func (RealClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Poll calls attempt until it reports done, the budget runs out or ctx ends.
// An attempt returns (true, nil) when done, (false, err) to try again with
// err kept as the last error. On failure the returned error wraps
// ErrBudgetExhausted (or ctx's error) and names the last real error.
func Poll(ctx context.Context, clk Clock, b Budget, what string, attempt func(ctx context.Context) (bool, error)) error {
	if clk == nil {
		clk = RealClock{}
	}
	if b.Total <= 0 {
		return fmt.Errorf("%s: no budget", what)
	}
	if b.Interval <= 0 || b.Interval > 2*time.Second {
		b.Interval = 2 * time.Second
	}
	if b.PerAttempt <= 0 || b.PerAttempt > b.Total {
		b.PerAttempt = b.Total
	}
	deadline := clk.Now().Add(b.Total)
	var lastErr error
	tries := 0
	for {
		tries++
		actx, cancel := context.WithTimeout(ctx, b.PerAttempt)
		done, err := attempt(actx)
		cancel()
		if done && err == nil {
			return nil
		}
		if err != nil {
			lastErr = err
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%s: %w after %d attempts, last error: %v", what, ctx.Err(), tries, describe(lastErr))
		}
		left := deadline.Sub(clk.Now())
		if left <= 0 {
			return fmt.Errorf("%s: %w (%s, %d attempts), last error: %w", what, ErrBudgetExhausted, b.Total, tries, orNone(lastErr))
		}
		sleep := b.Interval
		if sleep > left {
			sleep = left
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w after %d attempts, last error: %v", what, ctx.Err(), tries, describe(lastErr))
		case <-clk.After(sleep):
		}
	}
}

var errNone = errors.New("condition not met")

func orNone(err error) error {
	if err == nil {
		return errNone
	}
	return err
}

func describe(err error) string {
	if err == nil {
		return errNone.Error()
	}
	return err.Error()
}
