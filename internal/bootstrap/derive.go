package bootstrap

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
)

// Labels of the derivations. Changing one changes every derived secret and
// breaks joins into clusters initialised before the change: they are part
// of the contract, pinned by a golden test.
const (
	tokenLabel   = "provider-kubernetes/bootstrap-token/v1"
	certKeyLabel = "provider-kubernetes/certificate-key/v1"
)

const tokenAlphabet = "abcdefghijklmnopqrstuvwxyz0123456789"

// DeriveToken derives the cluster's bootstrap token from cluster_token:
// HMAC-SHA256 keyed by the cluster token, mapped onto [a-z0-9] by rejection
// sampling (no modulo bias), as "[a-z0-9]{6}.[a-z0-9]{16}". Every node with
// the same cluster section computes the same token, so a worker joins with
// nothing but the cloud-config the init node had.
func DeriveToken(clusterToken string) string {
	out := make([]byte, 0, 22)
	for block := uint32(0); len(out) < 22; block++ {
		for _, b := range prf(clusterToken, tokenLabel, block) {
			if b >= 252 { // 252 = 7*36: keep the mapping uniform
				continue
			}
			out = append(out, tokenAlphabet[b%36])
			if len(out) == 22 {
				break
			}
		}
	}
	return string(out[:6]) + "." + string(out[6:])
}

// DeriveCertificateKey derives the key kubeadm encrypts the uploaded
// control-plane certificates with (32 bytes, hex), the same way.
func DeriveCertificateKey(clusterToken string) string {
	return hex.EncodeToString(prf(clusterToken, certKeyLabel, 0))
}

func prf(key, label string, block uint32) []byte {
	m := hmac.New(sha256.New, []byte(key))
	m.Write([]byte(label))
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], block)
	m.Write(n[:])
	return m.Sum(nil)
}
