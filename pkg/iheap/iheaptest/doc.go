// Package iheaptest is the conformance suite of pkg/iheap's users. Every
// package that keeps items in an iheap.Heap wraps it in a type of its own
// (its order, its key prefix, its index field, its push and remove); Run
// drives such a wrapper through one table of operations, by way of a small
// Adapter the user's test writes, and checks after every step that the
// wrapper keeps the heap property, pops in order, and, where items know
// their position, that every recorded position is right and that Fix and
// Remove-at-position work.
//
// The suite is for tests only: it imports package testing.
package iheaptest
