from tdiff.cli import main

main()
