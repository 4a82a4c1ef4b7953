# SPDX-License-Identifier: MIT
# bash completion for snapkvd (installed as
# share/bash-completion/completions/snapkvd).
_snapkvd()
{
	local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD - 1]}
	case $prev in
	--config | --socket)
		COMPREPLY=($(compgen -f -- "$cur"))
		return
		;;
	--backend)
		COMPREPLY=($(compgen -W "host cuda" -- "$cur"))
		return
		;;
	--log-level)
		COMPREPLY=($(compgen -W "error warning notice info debug" -- "$cur"))
		return
		;;
	--pool-bytes | --threads | --workers)
		COMPREPLY=()
		return
		;;
	esac
	COMPREPLY=($(compgen -W "--config --socket --backend --pool-bytes --threads --workers
		--log-level --help --version" -- "$cur"))
}
complete -F _snapkvd snapkvd
