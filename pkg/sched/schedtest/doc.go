// Package schedtest builds the inputs of pkg/sched for tests, in the
// builder style of Kueue's test wrappers: a ticket for a token-id prompt,
// schedtest.Ticket().Prompt(2000).Shared(480).Seed(2).Obj(), and a chooser
// that records what it was offered. The tests of pkg/sched's drivers (the
// dispatcher) and pkg/sched's own external tests use it.
//
// Invariants: a builder's prompt is a pure function of its settings, so
// two tickets built alike hash to the same blocks, and prompts of one base
// share exactly their first Shared tokens.
//
// Cost: Obj hashes the prompt, O(prompt tokens); the recorder clones the
// candidates of every choice it sees.
//
// Tests only: pkg/sched's internal tests (package sched) cannot import it,
// since it imports pkg/sched.
package schedtest
