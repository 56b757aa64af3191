// Package fleet holds the mixed-fleet test: the previous release (named in
// PREVIOUS_RELEASE at the repository's top) and this tree, built and run
// side by side against one real redis-server, crossing first attempts and
// retries between them as a rolling upgrade does. It has no code of its
// own; see fleet_test.go and CHANGELOG.md's compatibility rule.
package fleet
