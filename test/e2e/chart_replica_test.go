package e2e

import (
	"crypto/tls"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/laneway-dev/laneway/internal/ha"
)

// TestChartReplicaIdentity: with leader election the chart gives every
// replica one identity for the replica link: by default a Secret it
// generates (a CA and a certificate it signs for server and client auth),
// which two replicas use for a mutual TLS handshake here; with
// certManager.enabled the Issuers and Certificates that make the same
// Secret; with a Secret of the user's, that one. One replica renders
// none of it.
func TestChartReplicaIdentity(t *testing.T) {
	sets := ciValueSets(t)
	objs := render(t, renderArgs{release: "lw", namespace: "ha", valuesFiles: []string{sets["ha"]}})
	sec := fromUnstructured[corev1.Secret](t, mustFind(t, objs, "Secret", "lw-laneway-replica"))
	dir := t.TempDir()
	for _, k := range []string{"tls.crt", "tls.key", "ca.crt"} {
		if err := os.WriteFile(filepath.Join(dir, k), sec.Data[k], 0o600); err != nil {
			t.Fatal(err)
		}
	}
	peers, err := ha.LoadPeerTLS(dir, logr.Discard())
	if err != nil {
		t.Fatalf("the generated identity does not load: %v", err)
	}
	if err := mutualHandshake(peers.Server(), peers.Client()); err != nil {
		t.Errorf("two replicas with the generated identity: %v", err)
	}
	dep := fromUnstructured[appsv1.Deployment](t, mustFind(t, objs, "Deployment", "lw-laneway"))
	if mounted := replicaVolume(dep); mounted != sec.Name {
		t.Errorf("the picker mounts the replica identity from %q, want %q", mounted, sec.Name)
	}

	objs = render(t, renderArgs{release: "lw", namespace: "ha", valuesFiles: []string{sets["ha"]}, set: []string{"epp.replicaIdentity.certManager.enabled=true"}})
	var issuers, certs int
	for _, o := range objs {
		switch o.GetKind() {
		case "Issuer":
			issuers++
		case "Certificate":
			certs++
		}
	}
	leaf := mustFind(t, objs, "Certificate", "lw-laneway-replica")
	usages, _, _ := unstructuredStrings(leaf.Object, "spec", "usages")
	if issuers != 2 || certs != 2 || findObject(objs, "Secret", "lw-laneway-replica") != nil ||
		!slices.Contains(usages, "server auth") || !slices.Contains(usages, "client auth") {
		t.Errorf("with cert-manager: %d Issuers, %d Certificates, the leaf's usages %v; want 2, 2, server and client auth, and no Secret of the chart's", issuers, certs, usages)
	}

	objs = render(t, renderArgs{release: "lw", namespace: "ha", valuesFiles: []string{sets["ha"]}, set: []string{"epp.replicaIdentity.secret=mine"}})
	dep = fromUnstructured[appsv1.Deployment](t, mustFind(t, objs, "Deployment", "lw-laneway"))
	if findObject(objs, "Secret", "") != nil || replicaVolume(dep) != "mine" {
		t.Errorf("with a Secret of the user's: the chart renders a Secret, or mounts %q", replicaVolume(dep))
	}

	objs = render(t, renderArgs{release: "lw", namespace: "one"})
	if findObject(objs, "Secret", "") != nil || findObject(objs, "Certificate", "") != nil {
		t.Error("one replica renders a replica identity")
	}
}

// replicaVolume is the Secret the picker's replica volume comes from.
func replicaVolume(dep *appsv1.Deployment) string {
	for _, v := range dep.Spec.Template.Spec.Volumes {
		if v.Name == "replica" && v.Secret != nil {
			return v.Secret.SecretName
		}
	}
	return ""
}

func unstructuredStrings(obj map[string]any, path ...string) ([]string, bool, error) {
	cur := any(obj)
	for _, p := range path {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, false, nil
		}
		cur = m[p]
	}
	list, ok := cur.([]any)
	if !ok {
		return nil, false, nil
	}
	var out []string
	for _, v := range list {
		if s, ok := v.(string); ok {
			out = append(out, s)
		}
	}
	return out, true, nil
}

// mutualHandshake serves with server on loopback and dials with client;
// it returns the first error of either side.
func mutualHandshake(server, client *tls.Config) error {
	ln, err := tls.Listen("tcp", "127.0.0.1:0", server)
	if err != nil {
		return err
	}
	defer ln.Close()
	served := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			served <- err
			return
		}
		served <- c.(*tls.Conn).Handshake()
		c.Close()
	}()
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", ln.Addr().String(), client)
	if err != nil {
		return err
	}
	c.Close()
	return <-served
}
