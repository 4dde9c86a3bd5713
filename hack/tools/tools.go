//go:build tools

// Package tools pins the versions of the command-line tools the Makefile
// builds into bin/ (controller-gen, helm, staticcheck). It is its own module so that the
// tools' dependency graphs never leak into the laneway module's go.mod.
package tools

import (
	_ "helm.sh/helm/v3/cmd/helm"
	_ "honnef.co/go/tools/cmd/staticcheck"
	_ "sigs.k8s.io/controller-tools/cmd/controller-gen"
)
