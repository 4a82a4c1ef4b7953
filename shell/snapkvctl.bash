# SPDX-License-Identifier: MIT
# bash completion for snapkvctl (installed as
# share/bash-completion/completions/snapkvctl). Plain `complete -F`: works
# with or without the bash-completion package.
_snapkvctl()
{
	local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD - 1]}
	local cmds="compact inspect status caches ledger metrics pressure top"
	local cmd="" sub="" i w
	for ((i = 1; i < COMP_CWORD; i++)); do
		w=${COMP_WORDS[i]}
		case $w in
		--socket | --timeout) ((i++)) ;;
		-*) ;;
		*)
			if [ -z "$cmd" ]; then cmd=$w; elif [ -z "$sub" ]; then sub=$w; fi
			;;
		esac
	done
	case $prev in
	--socket)
		COMPREPLY=($(compgen -f -- "$cur"))
		return
		;;
	--timeout | --window | --capacity | --kernel | --sinks | --protect | --threads | \
		--show | --interval | --count | --high | --high-leave | --critical | \
		--critical-leave | --scale-high | --scale-critical | --guaranteed-share)
		COMPREPLY=()
		return
		;;
	--policy)
		COMPREPLY=($(compgen -W "snapkv h2o streamingllm window" -- "$cur"))
		return
		;;
	--pooling)
		COMPREPLY=($(compgen -W "avg max" -- "$cur"))
		return
		;;
	--gqa)
		COMPREPLY=($(compgen -W "expand group" -- "$cur"))
		return
		;;
	--actions)
		COMPREPLY=($(compgen -W "notify,hooks,scale,evict,refuse none" -- "$cur"))
		return
		;;
	esac
	local opts
	case $cmd in
	"") opts="--socket --timeout --help --version" ;;
	compact)
		opts="--offline --socket --policy --window --capacity --kernel --pooling --gqa
		      --sinks --protect --threads --show --quiet --help"
		;;
	inspect) opts="--show --json --help" ;;
	status) opts="--socket --json --help" ;;
	caches | metrics) opts="--socket --help" ;;
	ledger) opts="--socket --json --bytes --help" ;;
	pressure)
		if [ "$sub" = set ]; then
			opts="--socket --high --high-leave --critical --critical-leave --actions
			      --scale-high --scale-critical --guaranteed-share --help"
		else
			opts="--socket --json --help"
		fi
		;;
	top) opts="--socket --once --interval --count --help" ;;
	esac
	if [ -z "$cmd" ] && [[ $cur != -* ]]; then
		COMPREPLY=($(compgen -W "$cmds" -- "$cur"))
	elif [[ $cur == -* ]]; then
		COMPREPLY=($(compgen -W "$opts --timeout" -- "$cur"))
	elif [ "$cmd" = pressure ] && [ -z "$sub" ]; then
		COMPREPLY=($(compgen -W "set" -- "$cur"))
	elif [ "$cmd" = compact ] || [ "$cmd" = inspect ]; then
		COMPREPLY=($(compgen -f -- "$cur"))
	else
		COMPREPLY=()
	fi
}
complete -F _snapkvctl snapkvctl
