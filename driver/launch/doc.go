// Package launch holds the driver's launchers beyond package proc's local one: ssh, which starts
// workers on other hosts and stops them so that nothing they started outlives them, even when the
// driver itself is killed, and Warm, which keeps a spare Python interpreter per slot with torch
// already imported. Both implement proc.Launcher; the agents' launcher is driver/agents'.
package launch
