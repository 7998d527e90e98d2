//go:build depsprobe

package internal

import (
	_ "github.com/coreos/go-systemd/v22/dbus"
	_ "github.com/coreos/go-systemd/v22/journal"
	_ "github.com/kairos-io/kairos-sdk/clusterplugin"
	_ "github.com/mudler/go-pluggable"
	_ "go.etcd.io/etcd/client/v3"
	_ "go.etcd.io/etcd/client/v3/snapshot"
	_ "go.etcd.io/etcd/etcdutl/v3/snapshot"
	_ "go.etcd.io/etcd/server/v3/embed"
)
