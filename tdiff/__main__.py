from tdiff.cli.main import main

main()
