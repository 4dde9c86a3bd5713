package testenv

import (
	"context"
	"fmt"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// tokenSeconds is the lifetime of a ServiceAccount token: longer than any
// suite runs.
const tokenSeconds = 3600

// ServiceAccountKubeconfig asks the API server of admin (through
// TokenRequest) for a token of ServiceAccount ns/sa and writes to path a
// kubeconfig that authenticates with it, with ns as its namespace. A
// process given that kubeconfig has exactly the rights bound to the
// ServiceAccount, as in a cluster. It also returns a rest.Config with the
// same identity, for the test's own checks of those rights.
func ServiceAccountKubeconfig(ctx context.Context, admin *rest.Config, ns, sa, path string) (*rest.Config, error) {
	cs, err := kubernetes.NewForConfig(admin)
	if err != nil {
		return nil, fmt.Errorf("clientset for the TokenRequest of %s/%s: %w", ns, sa, err)
	}
	expiry := int64(tokenSeconds)
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("TokenRequest for ServiceAccount %s/%s: %w", ns, sa, err)
	}
	const cluster, kctx = "envtest", "sa"
	kc := clientcmdapi.NewConfig()
	kc.Clusters[cluster] = &clientcmdapi.Cluster{Server: admin.Host, CertificateAuthorityData: admin.CAData}
	kc.AuthInfos[sa] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	kc.Contexts[kctx] = &clientcmdapi.Context{Cluster: cluster, AuthInfo: sa, Namespace: ns}
	kc.CurrentContext = kctx
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return nil, fmt.Errorf("write kubeconfig of %s/%s to %s: %w", ns, sa, path, err)
	}
	return &rest.Config{
		Host:            admin.Host,
		BearerToken:     tr.Status.Token,
		TLSClientConfig: rest.TLSClientConfig{CAData: admin.CAData},
	}, nil
}
