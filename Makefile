# Laneway. `make demo` runs the main job end to end; `make test` runs every
# test. Every tool a target needs is built from the Go module proxy into bin/.

SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c

GO        ?= go
BIN       := $(CURDIR)/bin
PKGS      := ./...
# Bounded time per fuzz target for `make fuzz`.
FUZZTIME  ?= 30s
# Benchmarks: pattern and count for `make bench`.
BENCH     ?= .
BENCHTIME ?= 1s
# Per-package timeout for `make test`.
TEST_TIMEOUT ?= 20m

# Envtest assets (real kube-apiserver and etcd), built from source by
# hack/envtest on first use (SPEC §12).
ENVTEST_DIR := $(BIN)/k8s
KUBE_APISERVER := $(ENVTEST_DIR)/kube-apiserver
ETCD := $(ENVTEST_DIR)/etcd
export KUBEBUILDER_ASSETS := $(ENVTEST_DIR)

.PHONY: all
all: build

##@ Build

.PHONY: build
build: ## Build every command into bin/.
	$(GO) build -o $(BIN)/ ./cmd/...

##@ Demo

.PHONY: demo
demo: build ## The weighted-share workload end to end: modelsim + epp + local gateway on loopback.
	$(BIN)/demo --bin $(BIN) --out $(CURDIR)/out/demo

##@ Test

.PHONY: test
test: envtest vet ## go vet + go test -race over the module.
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) $(PKGS)

.PHONY: vet
vet: ## go vet and a gofmt check.
	$(GO) vet $(PKGS)
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './bin/*')); \
	  if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

.PHONY: bench
bench: ## Run every benchmark once with allocation figures.
	$(GO) test -run '^$$' -bench '$(BENCH)' -benchmem -benchtime $(BENCHTIME) $(PKGS)

.PHONY: fuzz
fuzz: ## Run each fuzz target for FUZZTIME (default 30s).
	@set -e; for pkg in $$($(GO) list $(PKGS)); do \
	  dir=$$($(GO) list -f '{{.Dir}}' $$pkg); \
	  for t in $$(grep -ho '^func Fuzz[A-Za-z0-9_]*' $$dir/*_test.go 2>/dev/null | sed 's/^func //'); do \
	    echo "== $$pkg $$t ($(FUZZTIME))"; \
	    $(GO) test -run '^$$' -fuzz "^$$t\$$" -fuzztime $(FUZZTIME) $$pkg; \
	  done; \
	done

##@ Generate

# Code and manifest generators, built from hack/tools (its own module, so the
# tools' dependencies stay out of laneway's go.mod).
TOOLS_DIR      := hack/tools
CONTROLLER_GEN := $(BIN)/controller-gen
HELM           := $(BIN)/helm

.PHONY: generate
generate: controller-gen ## Generate deepcopy code for api/ (zz_generated.deepcopy.go).
	$(CONTROLLER_GEN) object paths=./api/...

.PHONY: manifests
manifests: controller-gen ## Generate the CRD manifests into config/crd/bases and the picker's Role into config/rbac.
	$(CONTROLLER_GEN) crd paths=./api/... output:crd:artifacts:config=config/crd/bases
	$(CONTROLLER_GEN) rbac:roleName=laneway-epp paths=./internal/controller/... output:rbac:dir=config/rbac

.PHONY: controller-gen
controller-gen: $(CONTROLLER_GEN) ## Build controller-gen into bin/.

$(CONTROLLER_GEN): $(TOOLS_DIR)/go.mod $(TOOLS_DIR)/go.sum
	cd $(TOOLS_DIR) && $(GO) build -o $(CONTROLLER_GEN) sigs.k8s.io/controller-tools/cmd/controller-gen

.PHONY: helm
helm: $(HELM) ## Build helm into bin/.

$(HELM): $(TOOLS_DIR)/go.mod $(TOOLS_DIR)/go.sum
	cd $(TOOLS_DIR) && $(GO) build -o $(HELM) helm.sh/helm/v3/cmd/helm

##@ Tools

.PHONY: envtest
envtest: $(KUBE_APISERVER) $(ETCD) ## Build kube-apiserver and etcd for envtest into bin/k8s.

$(KUBE_APISERVER) $(ETCD): hack/envtest/go.mod hack/envtest/go.sum
	@mkdir -p $(ENVTEST_DIR)
	cd hack/envtest && $(GO) build -o $(ENVTEST_DIR)/ ./kube-apiserver ./etcd
	@touch $(KUBE_APISERVER) $(ETCD)

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"} /^[a-zA-Z_-]+:.*?##/ { printf "  %-16s %s\n", $$1, $$2 } /^##@/ { printf "\n%s\n", substr($$0, 5) }' $(MAKEFILE_LIST)
