{{/*
Labels every object carries, as in deploy/kustomize/base (k8s-app: flannel on all of them;
tier and app on the ConfigMap and the DaemonSet, whose pods are selected by app: flannel
alone, like Go flannel's chart and plain manifest).
*/}}
{{- define "pyflannel.labels" -}}
k8s-app: flannel
{{- end }}

{{- define "pyflannel.nodeLabels" -}}
tier: node
k8s-app: flannel
app: flannel
{{- end }}

{{- define "pyflannel.image" -}}
{{ .repository }}:{{ .tag }}
{{- end }}

{{/*
net-conf.json, built as a map and serialised by toPrettyJson, so every value is quoted as
JSON needs whatever the values hold. The members each flannel.* key sets, per backend, are
those of Go flannel's chart; a key at 0, "" or false sets nothing.
*/}}
{{- define "pyflannel.netConf" -}}
{{- $f := .Values.flannel -}}
{{- if not (or .Values.podCidr .Values.podCidrv6) }}
{{- fail "podCidr and podCidrv6 are both empty: give the cluster's pod CIDR in podCidr (IPv4), podCidrv6 (IPv6) or both" }}
{{- end }}
{{- if and (eq $f.backend "ipsec") (not $f.psk) }}
{{- $given := false }}
{{- range $key, $_ := ($f.backendConfig | default dict) }}
{{- if eq (lower $key) "psk" }}{{ $given = true }}{{ end }}
{{- end }}
{{- if not $given }}
{{- fail "flannel.psk: the ipsec backend needs a PSK of 96 to 4096 characters, the same on every node (e.g. from `openssl rand -hex 48`)" }}
{{- end }}
{{- end }}
{{- $conf := dict -}}
{{- if .Values.podCidr }}
{{- $_ := set $conf "Network" (toString .Values.podCidr) }}
{{- else }}
{{- $_ := set $conf "EnableIPv4" false }}
{{- end }}
{{- if .Values.podCidrv6 }}
{{- $_ := set $conf "IPv6Network" (toString .Values.podCidrv6) }}
{{- $_ := set $conf "EnableIPv6" true }}
{{- end }}
{{- $_ := set $conf "EnableNFTables" (eq (toString $f.enableNFTables) "true") }}
{{- $named := dict }}
{{- if eq $f.backend "vxlan" }}
{{- if $f.backendPort }}{{ $_ := set $named "Port" (int64 $f.backendPort) }}{{ end }}
{{- if $f.vni }}{{ $_ := set $named "VNI" (int64 $f.vni) }}{{ end }}
{{- if eq (toString $f.GBP) "true" }}{{ $_ := set $named "GBP" true }}{{ end }}
{{- if eq (toString $f.directRouting) "true" }}{{ $_ := set $named "DirectRouting" true }}{{ end }}
{{- if $f.mtu }}{{ $_ := set $named "MTU" (int64 $f.mtu) }}{{ end }}
{{- if $f.macPrefix }}{{ $_ := set $named "MacPrefix" (toString $f.macPrefix) }}{{ end }}
{{- else if eq $f.backend "wireguard" }}
{{- if $f.backendPort }}{{ $_ := set $named "ListenPort" (int64 $f.backendPort) }}{{ end }}
{{- if $f.backendPortv6 }}{{ $_ := set $named "ListenPortV6" (int64 $f.backendPortv6) }}{{ end }}
{{- if $f.psk }}{{ $_ := set $named "PSK" (toString $f.psk) }}{{ end }}
{{- if $f.mtu }}{{ $_ := set $named "MTU" (int64 $f.mtu) }}{{ end }}
{{- if $f.tunnelMode }}{{ $_ := set $named "Mode" (toString $f.tunnelMode) }}{{ end }}
{{- if $f.keepaliveInterval }}
{{- $_ := set $named "PersistentKeepaliveInterval" (int64 $f.keepaliveInterval) }}
{{- end }}
{{- else if eq $f.backend "ipsec" }}
{{- if $f.psk }}{{ $_ := set $named "PSK" (toString $f.psk) }}{{ end }}
{{- else if eq $f.backend "udp" }}
{{- if $f.backendPort }}{{ $_ := set $named "Port" (int64 $f.backendPort) }}{{ end }}
{{- end }}
{{- $backend := dict "Type" $f.backend }}
{{- range $key, $value := ($f.backendConfig | default dict) }}
{{- if eq (lower $key) "type" }}
{{- fail (printf "flannel.backendConfig.%s: the backend type is flannel.backend" $key) }}
{{- end }}
{{- range $set := keys $named }}
{{- if eq (lower $key) (lower $set) }}
{{- fail (printf "flannel.backendConfig.%s: %s is already set from the flannel.* values; set it in one place only" $key $set) }}
{{- end }}
{{- end }}
{{- $_ := set $backend $key $value }}
{{- end }}
{{- $_ := set $conf "Backend" (merge $backend $named) }}
{{- toPrettyJson $conf }}
{{- end }}

{{/*
The CNI conflist, refused here when it is not a JSON object: a broken conflist would
otherwise reach every node and leave kubelet without a network.
*/}}
{{- define "pyflannel.cniConf" -}}
{{- $conf := .Values.flannel.cniConf }}
{{- $parsed := fromJson $conf }}
{{- if or (not $parsed) (hasKey $parsed "Error") }}
{{- fail "flannel.cniConf is not a JSON object: give the CNI network config list as JSON text" }}
{{- end }}
{{- $conf }}
{{- end }}

{{/*
What the schema cannot say. flannel.image_cni: Go flannel's chart named flannel_cni.image so
until v0.28.3, and ignores it since. flannel.args: every item that starts with "-" names one of
flanneld's flags (flannel/flags.py, kept equal by tests/unit/test_chart.py), as -name, --name,
-name=value or --name=value; an item that does not is the value of the flag before it.
flanneld exits on any other flag, on every node. --healthz-port comes from
flannel.healthz.port.
*/}}
{{- define "pyflannel.checkValues" -}}
{{- if hasKey .Values.flannel "image_cni" }}
{{- fail "flannel.image_cni: Go flannel's chart calls it flannel.flannel_cni.image since v0.28.3 (and ignores image_cni); move repository and tag there" }}
{{- end }}
{{- $known := list
    "etcd-endpoints" "etcd-prefix" "etcd-keyfile" "etcd-certfile" "etcd-cafile"
    "etcd-username" "etcd-password" "iface" "iface-regex" "iface-can-reach" "subnet-file"
    "public-ip" "public-ipv6" "subnet-lease-renew-margin" "subnet-lease-ttl" "ip-masq"
    "ip-masq-fully-random-disable" "kube-subnet-mgr" "kube-api-url" "kube-annotation-prefix"
    "kubeconfig-file" "version" "healthz-ip" "healthz-port" "reconcile-interval"
    "iptables-resync" "iptables-mode" "iptables-forward-rules" "encap-peers-only" "drop-pod-encap"
    "ip-blackhole-route" "net-config-path" "set-node-network-unavailable" "v" "vmodule"
    "log_backtrace_at" "h" "help" }}
{{- $healthz := int (.Values.flannel.healthz.port | default 0) }}
{{- range $i, $arg := (.Values.flannel.args | default list) }}
{{- if hasPrefix "-" $arg }}
{{- $name := first (splitList "=" (trimPrefix "-" (trimPrefix "-" $arg))) }}
{{- if not (has $name $known) }}
{{- fail (printf "flannel.args[%d]: %s is not a flag of flanneld (flanneld --help lists them)" $i $arg) }}
{{- end }}
{{- if and (eq $name "healthz-port") $healthz }}
{{- fail (printf "flannel.args[%d]: %s: the chart sets --healthz-port from flannel.healthz.port; set that instead" $i $arg) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
