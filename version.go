package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// version is this tree's release (CHANGELOG.md: the version in progress,
// with -dev, or the one released); a build may stamp another with -ldflags
// "-X main.version=v1.2.3 -X main.revision=<commit>" (the Dockerfile does,
// building without .git and with -buildvcs=false). Without a stamped
// revision, the VCS stamp of the build info is used.
var (
	version  = "v0.9.0-dev"
	revision = ""
)

// serviceVersion is this build's version: the -X main.version stamp, else
// the module version, else the VCS revision, else "devel".
func serviceVersion() string {
	if version != "" {
		return version
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "devel"
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	for _, kv := range bi.Settings {
		if kv.Key == "vcs.revision" {
			return kv.Value
		}
	}
	return "devel"
}

// buildLabels are idemproxy_build_info's labels: the version, the VCS
// revision (stamped, or from the build's VCS information; "unknown"
// without either) and the Go version.
func buildLabels() (version, revision, goVersion string) {
	version, revision, goVersion = serviceVersion(), revisionStamp(), runtime.Version()
	return version, revision, goVersion
}

// revisionStamp is the -X main.revision stamp, else the build's
// vcs.revision, else "unknown".
func revisionStamp() string {
	if revision != "" {
		return revision
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, kv := range bi.Settings {
			if kv.Key == "vcs.revision" {
				return kv.Value
			}
		}
	}
	return "unknown"
}

// buildInfo is what -version prints: the version, the Go version and the
// revision, stamped or from the VCS information of the build.
func buildInfo() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "idemproxy " + serviceVersion()
	}
	s := fmt.Sprintf("idemproxy %s %s", serviceVersion(), bi.GoVersion)
	if revision != "" {
		return s + " vcs.revision=" + revision
	}
	for _, kv := range bi.Settings {
		if kv.Key == "vcs.revision" || kv.Key == "vcs.time" || kv.Key == "vcs.modified" {
			s += " " + kv.Key + "=" + kv.Value
		}
	}
	return s
}
