// Package docs holds the tests that keep the documentation true to the
// tree: every "SPEC §N" citation in a tracked file names a section that
// docs/spec.md has, every relative Markdown link to a heading finds that
// heading, and every package path docs/architecture.md names exists.
//
// The package holds only tests; this file exists so the package has a
// non-test file stating its job.
package docs
